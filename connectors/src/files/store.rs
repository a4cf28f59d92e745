//! Object stores: local files and S3-compatible stores, created on first use from
//! `[storage.s3]`.

use std::sync::Arc;

use basin_core::S3Config;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use url::Url;

/// Finds the store for a URL; builds an S3 client for each `s3://bucket` the first time it is
/// seen, with the settings of `[storage.s3]`.
#[derive(Debug)]
pub struct BasinObjectStoreRegistry {
    inner: DefaultObjectStoreRegistry,
    s3: Option<S3Config>,
}

impl BasinObjectStoreRegistry {
    pub fn new(s3: Option<S3Config>) -> Self {
        Self {
            inner: DefaultObjectStoreRegistry::new(),
            s3,
        }
    }

    fn build_s3(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
        // With [storage.s3] the configuration alone decides (no stray AWS_* variables);
        // without it, the usual AWS environment variables apply.
        let (config, builder) = match &self.s3 {
            Some(c) => (c.clone(), AmazonS3Builder::new()),
            None => (S3Config::default(), AmazonS3Builder::from_env()),
        };
        let mut builder = builder
            .with_http_connector(crate::io_connector())
            .with_bucket_name(bucket);
        builder = builder.with_region(config.region.as_deref().unwrap_or("us-east-1"));
        if let Some(endpoint) = &config.endpoint {
            let allow_http = config
                .allow_http
                .unwrap_or_else(|| endpoint.starts_with("http://"));
            builder = builder.with_endpoint(endpoint).with_allow_http(allow_http);
        }
        if let Some(id) = &config.access_key_id {
            builder = builder.with_access_key_id(id);
        }
        if let Some(secret) = &config.secret_access_key {
            builder = builder.with_secret_access_key(secret.expose());
        }
        if let Some(token) = &config.session_token {
            builder = builder.with_token(token.expose());
        }
        builder = builder.with_virtual_hosted_style_request(!config.path_style);
        let store = builder.build().map_err(|e| {
            // object_store's messages name the setting, never the secret value.
            DataFusionError::Plan(format!(
                "cannot open s3://{bucket}: {e}; check [storage.s3] in the configuration"
            ))
        })?;
        Ok(Arc::new(store))
    }
}

impl ObjectStoreRegistry for BasinObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.inner.get_store(url) {
            return Ok(store);
        }
        match url.scheme() {
            "s3" | "s3a" => {
                let bucket = url.host_str().ok_or_else(|| {
                    DataFusionError::Plan(format!("S3 location {url} has no bucket name"))
                })?;
                let store = self.build_s3(bucket)?;
                let key = Url::parse(&format!("{}://{bucket}", url.scheme()))
                    .map_err(|e| DataFusionError::Plan(format!("bad S3 location {url}: {e}")))?;
                self.inner.register_store(&key, store.clone());
                Ok(store)
            }
            other => Err(DataFusionError::Plan(format!(
                "no object store for {url}: scheme `{other}` is not supported \
                 (use file:// or s3://)"
            ))),
        }
    }
}
