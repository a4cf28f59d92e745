//! Iceberg's file I/O on Basin's object stores: one S3 client stack (object_store) for file
//! tables and Iceberg tables, local files for the embedded warehouse.
//!
//! The storage is serialized into plans (typetag), so executors rebuild the same stores from
//! the same properties; the properties may hold credentials and are never displayed.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, S3_ACCESS_KEY_ID, S3_ENDPOINT,
    S3_PATH_STYLE_ACCESS, S3_REGION, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use serde::{Deserialize, Serialize};
use url::Url;

/// Builds [`BasinStorage`] from a table's FileIO properties.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BasinStorageFactory;

#[typetag::serde]
impl StorageFactory for BasinStorageFactory {
    fn build(&self, config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(BasinStorage::new(config.props().clone())))
    }
}

/// Iceberg storage on object_store: `file://` (or a bare absolute path) and `s3://`/`s3a://`.
#[derive(Clone, Serialize, Deserialize)]
pub struct BasinStorage {
    props: HashMap<String, String>,
    /// `props` sorted, made once: the first half of this storage's keys in [`STORES`].
    #[serde(skip)]
    sorted_props: OnceLock<Arc<[(String, String)]>>,
}

/// A store: the storage properties (sorted) and `scheme://bucket`.
type StoreKey = (Arc<[(String, String)]>, String);

/// The stores of the whole process. Every scan partition and table write builds a
/// `BasinStorage` of its own (from the plan), so stores kept per instance meant a new S3
/// client, with new connections, for every partition of every query.
static STORES: LazyLock<Mutex<HashMap<StoreKey, Arc<dyn ObjectStore>>>> =
    LazyLock::new(Mutex::default);
/// Stores kept before the cache starts again (properties change with rotated credentials).
const STORES_KEPT: usize = 64;

impl std::fmt::Debug for BasinStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Properties may hold credentials: never print them.
        f.debug_struct("BasinStorage").finish_non_exhaustive()
    }
}

impl BasinStorage {
    pub fn new(props: HashMap<String, String>) -> Self {
        Self {
            props,
            sorted_props: OnceLock::new(),
        }
    }

    /// The store and the object path for a location.
    pub(crate) fn resolve(&self, location: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
        if location.starts_with('/') {
            return Ok((self.store("file", "", location)?, local_path(location)?));
        }
        let url = Url::parse(location).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("`{location}` is not a valid file location: {e}"),
            )
        })?;
        match url.scheme() {
            "file" => Ok((self.store("file", "", location)?, local_path(url.path())?)),
            scheme @ ("s3" | "s3a") => {
                let bucket = url.host_str().ok_or_else(|| {
                    Error::new(
                        ErrorKind::DataInvalid,
                        format!("S3 location `{location}` has no bucket"),
                    )
                })?;
                let key = url.path().trim_start_matches('/');
                let path = Path::from_url_path(key).map_err(|e| {
                    Error::new(
                        ErrorKind::DataInvalid,
                        format!("bad S3 key in `{location}`: {e}"),
                    )
                })?;
                Ok((self.store(scheme, bucket, location)?, path))
            }
            other => Err(Error::new(
                ErrorKind::FeatureUnsupported,
                format!(
                    "cannot read or write `{location}`: scheme `{other}` is not supported \
                     (Basin's Iceberg storage supports file:// and s3://)"
                ),
            )),
        }
    }

    fn store(&self, scheme: &str, bucket: &str, location: &str) -> Result<Arc<dyn ObjectStore>> {
        let props = self.sorted_props.get_or_init(|| {
            let mut props: Vec<(String, String)> = self
                .props
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            props.sort();
            props.into()
        });
        let key = (props.clone(), format!("{scheme}://{bucket}"));
        let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(store) = stores.get(&key) {
            return Ok(store.clone());
        }
        let store: Arc<dyn ObjectStore> = if scheme == "file" {
            Arc::new(LocalFileSystem::new())
        } else {
            Arc::new(self.build_s3(bucket).map_err(|e| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("cannot open the S3 store for `{location}`: {e}"),
                )
            })?)
        };
        if stores.len() >= STORES_KEPT {
            stores.clear();
        }
        stores.insert(key, store.clone());
        Ok(store)
    }

    fn build_s3(&self, bucket: &str) -> object_store::Result<object_store::aws::AmazonS3> {
        let get = |k: &str| self.props.get(k).map(String::as_str);
        let mut builder = AmazonS3Builder::new()
            .with_http_connector(crate::io_connector())
            .with_bucket_name(bucket)
            .with_region(
                get(S3_REGION)
                    .or(get("client.region"))
                    .unwrap_or("us-east-1"),
            );
        if let Some(endpoint) = get(S3_ENDPOINT) {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(v) = get(S3_ACCESS_KEY_ID) {
            builder = builder.with_access_key_id(v);
        }
        if let Some(v) = get(S3_SECRET_ACCESS_KEY) {
            builder = builder.with_secret_access_key(v);
        }
        if let Some(v) = get(S3_SESSION_TOKEN) {
            builder = builder.with_token(v);
        }
        let path_style = get(S3_PATH_STYLE_ACCESS)
            .map(|v| v.eq_ignore_ascii_case("true"))
            .unwrap_or(true);
        builder
            .with_virtual_hosted_style_request(!path_style)
            .build()
    }
}

fn local_path(path: &str) -> Result<Path> {
    Path::from_filesystem_path(path)
        .or_else(|_| Path::from_url_path(path))
        .map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("bad local path `{path}`: {e}"),
            )
        })
}

fn io_error(action: &str, location: &str, e: object_store::Error) -> Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => ErrorKind::DataInvalid,
        _ => ErrorKind::Unexpected,
    };
    Error::new(kind, format!("cannot {action} `{location}`: {e}"))
}

#[async_trait]
#[typetag::serde]
impl Storage for BasinStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let (store, key) = self.resolve(path)?;
        match store.head(&key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_error("check", path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let (store, key) = self.resolve(path)?;
        let meta = store
            .head(&key)
            .await
            .map_err(|e| io_error("stat", path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let (store, key) = self.resolve(path)?;
        let result = store
            .get(&key)
            .await
            .map_err(|e| io_error("read", path, e))?;
        result.bytes().await.map_err(|e| io_error("read", path, e))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let (store, key) = self.resolve(path)?;
        Ok(Box::new(ObjectReader {
            store,
            key,
            location: path.to_string(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let (store, key) = self.resolve(path)?;
        store
            .put(&key, bs.into())
            .await
            .map_err(|e| io_error("write", path, e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let (store, key) = self.resolve(path)?;
        let upload = store
            .put_multipart(&key)
            .await
            .map_err(|e| io_error("write", path, e))?;
        Ok(Box::new(ObjectWriter {
            writer: Some(WriteMultipart::new(upload)),
            location: path.to_string(),
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let (store, key) = self.resolve(path)?;
        match store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error("delete", path, e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let (store, key) = self.resolve(path)?;
        let mut listing = store.list(Some(&key));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| io_error("list", path, e))?;
            match store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(io_error("delete", path, e)),
            }
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    key: Path,
    location: String,
}

#[async_trait]
impl FileRead for ObjectReader {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&self.key, range)
            .await
            .map_err(|e| io_error("read", &self.location, e))
    }
}

struct ObjectWriter {
    writer: Option<WriteMultipart>,
    location: String,
}

#[async_trait]
impl FileWrite for ObjectWriter {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let location = self.location.clone();
        let writer = self.writer.as_mut().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!("`{location}` is already closed"),
            )
        })?;
        writer
            .wait_for_capacity(8)
            .await
            .map_err(|e| io_error("write", &location, e))?;
        writer.put(bs);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        let writer = self.writer.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!("`{}` is already closed", self.location),
            )
        })?;
        writer
            .finish()
            .await
            .map_err(|e| io_error("write", &self.location, e))?;
        Ok(())
    }
}
