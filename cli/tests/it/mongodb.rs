//! The MongoDB connector on DocumentDB (`.ci/services.sh start mongodb`): types from a sample
//! and declared ones, names that are not paths, splits by `_id` ranges, TLS and logins. The
//! shared conformance and hostile-strings suites in `federation` run on it as well.

use bson::{Bson, doc};

use crate::federation::{Fixture, mongo_commands};
use crate::stderr;

#[test]
fn mongodb_types_come_from_a_sample_or_from_basin_toml() {
    let Some(f) = Fixture::new("mgtypes") else {
        return;
    };
    let n = &f.name;
    let oid = bson::oid::ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap();
    f.mg(|db| async move {
        db.collection::<bson::Document>("things")
            .insert_many([
                doc! {
                    "_id": oid, "n": 1, "big": 5_000_000_000_i64, "x": 1.5,
                    "price": "12.30".parse::<bson::Decimal128>().unwrap(), "ok": true,
                    "at": bson::DateTime::from_millis(1_704_067_200_000),
                    "bin": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 255] }),
                    "address": { "city": "Lyon", "zip": 69001 },
                    "tags": ["a", "b"], "mixed": "text", "nothing": Bson::Null,
                    "a.b": "dotted", "Mixed Case": "mc",
                },
                doc! {
                    "_id": bson::oid::ObjectId::parse_str("65a1b2c3d4e5f60718293a4c").unwrap(),
                    "n": 2, "big": 7, "x": 2, "price": "0.5".parse::<bson::Decimal128>().unwrap(),
                    "ok": false, "address": { "city": "Oslo" }, "tags": [],
                    "mixed": 42, "a.b": "dotted 2", "Mixed Case": "mc2",
                },
            ])
            .await
            .unwrap();
        db.collection::<bson::Document>("odd")
            .insert_many([doc! { "_id": 1, "v": 1 }, doc! { "_id": 2, "v": "two" }])
            .await
            .unwrap();
    });
    let described = f.ok(&format!(
        "SELECT column_name, data_type FROM information_schema.columns \
         WHERE table_catalog = 'mg' AND table_schema = '{n}' AND table_name = 'things' \
         ORDER BY ordinal_position"
    ));
    for line in [
        "_id,Utf8",
        "n,Int64",
        "big,Int64",
        "x,Float64",
        "price,\"Decimal128(38, 2)\"",
        "ok,Boolean",
        "at,\"Timestamp(ms, \"\"UTC\"\")\"",
        "bin,Binary",
        "tags,List(Utf8)",
        "mixed,Utf8",
        "a.b,Utf8",
    ] {
        assert!(described.contains(line), "{line} not in\n{described}");
    }
    assert!(described.contains("address,\"Struct("), "{described}");
    assert_eq!(
        f.ok(&format!(
            "SELECT _id, n, big, x, price, ok, at, address['city'] AS city, cardinality(tags) AS tags, tags[1] AS first, mixed, \
             \"a.b\", \"Mixed Case\" FROM mg.{n}.things ORDER BY n"
        )),
        "_id,n,big,x,price,ok,at,city,tags,first,mixed,a.b,Mixed Case\n\
         65a1b2c3d4e5f60718293a4b,1,5000000000,1.5,12.30,true,2024-01-01T00:00:00Z,Lyon,2,a,text,dotted,mc\n\
         65a1b2c3d4e5f60718293a4c,2,7,2.0,0.50,false,,Oslo,0,,42,dotted 2,mc2\n"
    );
    // ObjectIds compare as their hex text; names that are paths are read, not pushed.
    let (out, sent) = f.traced(
        &f.s.mg_log,
        &format!(
            "SELECT n FROM mg.{n}.things WHERE _id > '65a1b2c3d4e5f60718293a4b' \
             AND \"a.b\" = 'dotted 2' AND \"Mixed Case\" = 'mc2'"
        ),
    );
    assert_eq!(out, "n\n2\n");
    let sent = mongo_commands(&sent);
    assert!(
        sent.contains("\"_id\":{\"$gt\":{\"$oid\":\"65a1b2c3d4e5f60718293a4b\"}}")
            && sent.contains("\"Mixed Case\":{\"$eq\":\"mc2\"}")
            && !sent.contains("\"a.b\":{"),
        "{sent}"
    );
    // A global aggregate over nothing is one row; a sum of no values is NULL.
    assert_eq!(
        f.ok(&format!(
            "SELECT count(*) AS c, sum(big) AS s, max(n) AS m FROM mg.{n}.things WHERE n > 5"
        )),
        "c,s,m\n0,,\n"
    );
    // A value the sample did not see fails clearly (the sample of `odd` is all of it: `v`
    // is text); declared as bigint, the string in document 2 is named.
    assert_eq!(
        f.ok(&format!("SELECT v FROM mg.{n}.odd ORDER BY _id")),
        "v\n1\ntwo\n"
    );
    f.declare_mg("odd", &["_id int", "v bigint"]);
    let out = f.run(&format!("SELECT v FROM mg.{n}.odd ORDER BY _id"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("document _id 2") && err.contains("a string") && err.contains("json"),
        "{err}"
    );
}

#[test]
fn mongodb_large_scans_split_by_id_ranges() {
    let Some(f) = Fixture::new("mgsplits") else {
        return;
    };
    let n = &f.name;
    f.mg(|db| async move {
        let docs: Vec<bson::Document> = (0..40_000)
            .map(|i| doc! { "k": i % 10, "v": i as i64, "pad": "x".repeat(60) })
            .collect();
        db.collection::<bson::Document>("big")
            .insert_many(docs)
            .await
            .unwrap();
    });
    let plan = f.ok(&format!("EXPLAIN SELECT v, pad FROM mg.{n}.big"));
    assert!(
        plan.contains("splits=4 (by _id ranges)"),
        "expected four _id splits:\n{plan}"
    );
    let (out, sent) = f.traced(
        &f.s.mg_log,
        &format!("SELECT count(*) AS c, sum(v) AS s, count(DISTINCT pad) AS p FROM mg.{n}.big"),
    );
    assert_eq!(out, "c,s,p\n40000,799980000,1\n");
    let sent = mongo_commands(&sent);
    let splits = sent
        .lines()
        .filter(|l| l.starts_with("{\"aggregate\":\"big\"") && l.contains("\"_id\":{\"$"))
        .count();
    assert_eq!(splits, 4, "{sent}");
    // Grouped in the server: one pipeline, not split.
    let (out, sent) = f.traced(
        &f.s.mg_log,
        &format!("SELECT k, count(*) AS c FROM mg.{n}.big GROUP BY k ORDER BY k LIMIT 2"),
    );
    assert_eq!(out, "k,c\n0,4000\n1,4000\n");
    assert!(mongo_commands(&sent).contains("\"$group\""), "{sent}");
}

#[test]
fn mongodb_tls_logins_and_errors() {
    let Some(f) = Fixture::new("mgtls") else {
        return;
    };
    let (Ok(verified), Ok(ca)) = (
        std::env::var("BASIN_TEST_MONGODB_URL_VERIFIED"),
        std::env::var("BASIN_TEST_MONGODB_CA_FILE"),
    ) else {
        assert!(
            !crate::in_ci(),
            "BASIN_TEST_MONGODB_URL_VERIFIED is not set"
        );
        return;
    };
    // The CA given as a setting (the URL without tlsCAFile), a full verification.
    let plain = verified.replace(&format!("&tlsCAFile={ca}"), "");
    let wrong = f.s.mg_url.replace("basinsecret", "Wr0ng-Secret");
    let url = url::Url::parse(&f.s.mg_url).unwrap();
    let unreachable = f.s.mg_url.replace(
        &format!(":{}", url.port().unwrap()),
        &format!(":{}", free_port()),
    );
    std::fs::write(
        &f.config,
        format!(
            "[catalogs.mg]\nconnector = \"mongodb\"\nurl = \"{plain}\"\ntls_ca_file = \"{ca}\"\n\n\
             [catalogs.bad]\nconnector = \"mongodb\"\nurl = \"{wrong}\"\n\n\
             [catalogs.gone]\nconnector = \"mongodb\"\nurl = \"{unreachable}\"\n"
        ),
    )
    .unwrap();
    f.mg(|db| async move {
        db.collection::<bson::Document>("t")
            .insert_one(doc! { "_id": 1, "v": "hello" })
            .await
            .unwrap()
    });
    assert_eq!(
        f.ok(&format!("SELECT v FROM mg.{}.t", f.name)),
        "v\nhello\n"
    );
    for (catalog, want) in [("bad", "login refused"), ("gone", "mongodb source `gone`")] {
        let out = f.run(&format!("SELECT v FROM {catalog}.{}.t", f.name));
        assert!(!out.status.success(), "{catalog}");
        let err = stderr(&out);
        assert!(err.contains(want), "{catalog}: {err}");
        assert!(
            !err.contains("Wr0ng-Secret") && !err.contains("basinsecret"),
            "{catalog}: a secret in the error: {err}"
        );
    }
}

/// A TCP port nothing listens on (bound once, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}
