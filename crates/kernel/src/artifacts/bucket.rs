//! An S3-compatible bucket (AWS S3, Cloudflare R2, MinIO) holding artifacts' bytes, one object per
//! artifact at `<prefix><artifact id>`, through `object_store`'s S3 client on the core's I/O
//! runtime.
//!
//! Every request is bounded: [`REQUEST_TIMEOUT`] each, retried with backoff on a 5xx, a 429 or a
//! lost connection, [`RETRIES`] times within [`RETRY_WINDOW`]. A failure is
//! [`WorldError::ObjectStore`] (`WORLD_IO`), naming the endpoint, bucket and key; credentials come
//! from the AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, a web identity or the container's or instance's role) and are never shown.

use crate::bytes::Bytes;
use crate::error::{Result, WorldError};
use crate::runtime::io_runtime;
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig};
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

/// How long one request may take, sending or receiving its bytes included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a request that failed transiently, at most.
pub const RETRIES: usize = 3;
/// No retry starts later than this after the first attempt.
pub const RETRY_WINDOW: Duration = Duration::from_secs(30);

/// Where a world's artifacts' bytes go (`artifacts: { s3: … }`).
#[derive(Debug, Clone)]
pub struct BucketOptions {
    pub bucket: String,
    /// Put before each artifact id in its key: `little-workflow/` unless given.
    pub prefix: String,
    /// The store's URL (MinIO, R2, a test server); AWS for the region when absent.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// `https://endpoint/bucket/key` rather than `https://bucket.endpoint/key`.
    pub force_path_style: bool,
}

/// The prefix of every key unless the options name another.
pub const DEFAULT_PREFIX: &str = "little-workflow/";

/// An object of the bucket, as listed.
pub struct Listed {
    pub artifact_id: String,
    pub modified: SystemTime,
}

/// A bucket, opened.
pub struct Bucket {
    store: AmazonS3,
    prefix: String,
    bucket: String,
    /// The endpoint as errors name it.
    endpoint: String,
}

impl Bucket {
    /// Open the bucket `options` name (nothing is sent yet). Options that cannot name one are
    /// `EVENT_VALIDATION` at `artifacts.s3.<field>`.
    pub fn open(options: BucketOptions) -> Result<Bucket> {
        let invalid = |field: &str, message: &str| WorldError::validation(format!("artifacts.s3.{field}"), message);
        if options.bucket.is_empty() {
            return Err(invalid("bucket", "must be a non-empty string"));
        }
        if options.prefix.starts_with('/') || options.prefix.contains("//") {
            return Err(invalid("prefix", "must not start with / or hold //"));
        }
        let region = options.region.clone().or_else(|| std::env::var("AWS_REGION").ok());
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&options.bucket)
            .with_virtual_hosted_style_request(!options.force_path_style)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    .with_allow_http(options.endpoint.as_deref().is_some_and(|e| e.starts_with("http://"))),
            )
            .with_retry(RetryConfig {
                max_retries: RETRIES,
                retry_timeout: RETRY_WINDOW,
                ..RetryConfig::default()
            });
        if let Some(region) = &region {
            builder = builder.with_region(region);
        }
        if let Some(endpoint) = &options.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let endpoint = options
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", region.as_deref().unwrap_or("us-east-1")));
        let store = builder.build().map_err(|e| WorldError::ObjectStore {
            context: "opening the bucket".into(),
            endpoint: endpoint.clone(),
            bucket: options.bucket.clone(),
            key: options.prefix.clone(),
            message: e.to_string(),
        })?;
        Ok(Bucket {
            store,
            prefix: options.prefix,
            bucket: options.bucket,
            endpoint,
        })
    }

    /// The key of artifact `id`.
    pub fn key(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }

    fn error(&self, doing: &str, key: String, e: object_store::Error) -> WorldError {
        WorldError::ObjectStore {
            context: doing.into(),
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            key,
            message: e.to_string(),
        }
    }

    /// Write artifact `id`'s bytes only if no object is there (`If-None-Match: *`): `false` when
    /// one was, which is left as it is.
    pub fn create(&self, id: &str, bytes: &[u8]) -> Result<bool> {
        let key = self.key(id);
        let put = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        match block_on(self.store.put_opts(&Path::from(key.as_str()), payload, put))? {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.error("writing an artifact's object", key, e)),
        }
    }

    /// Write artifact `id`'s bytes over whatever object is there.
    pub fn overwrite(&self, id: &str, bytes: &[u8]) -> Result<()> {
        let key = self.key(id);
        let payload = PutPayload::from(bytes.to_vec());
        block_on(self.store.put(&Path::from(key.as_str()), payload))?
            .map(drop)
            .map_err(|e| self.error("writing an artifact's object", key, e))
    }

    /// Artifact `id`'s object and the sha256 of all of it, or `None` when there is none. Up to
    /// `expected` bytes are kept (an object of another length is not the artifact's: its hash
    /// says so without keeping the rest).
    pub fn read(&self, id: &str, expected: u64) -> Result<Option<(Bytes, Vec<u8>)>> {
        let key = self.key(id);
        let location = Path::from(key.as_str());
        let read = async {
            let got = match self.store.get(&location).await {
                Ok(got) => got,
                Err(e) if no_object(&e) => return Ok(None),
                Err(e) => return Err(e),
            };
            let kept = got.meta.size.min(expected) as usize;
            let mut bytes = Bytes::to_fill(kept).map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })?;
            let mut hash = Sha256::new();
            let mut at = 0usize;
            let mut body = got.into_stream();
            while let Some(piece) = body.try_next().await? {
                hash.update(&piece);
                let room = kept.saturating_sub(at).min(piece.len());
                bytes.as_mut_slice()[at..at + room].copy_from_slice(&piece[..room]);
                at += piece.len();
            }
            Ok(Some((bytes, hash.finalize().to_vec())))
        };
        block_on(read)?.map_err(|e| self.error("reading an artifact's object", key, e))
    }

    /// Remove artifact `id`'s object; a missing one is a no-op.
    pub fn delete(&self, id: &str) -> Result<()> {
        let key = self.key(id);
        match block_on(self.store.delete(&Path::from(key.as_str())))? {
            Ok(()) => Ok(()),
            Err(e) if no_object(&e) => Ok(()),
            Err(e) => Err(self.error("removing an artifact's object", key, e)),
        }
    }

    /// The objects under the prefix named as an artifact is, with when each was last written.
    pub fn list(&self) -> Result<Vec<Listed>> {
        let prefix = self.prefix.trim_end_matches('/');
        let location = (!prefix.is_empty()).then(|| Path::from(prefix));
        let listed = block_on(self.store.list(location.as_ref()).try_collect::<Vec<_>>())?
            .map_err(|e| self.error("listing the bucket's objects", self.prefix.clone(), e))?;
        Ok(listed
            .into_iter()
            .filter_map(|meta| {
                let id = meta.location.as_ref().strip_prefix(self.prefix.as_str())?.to_string();
                crate::ids::is_artifact_id(&id).then(|| Listed {
                    artifact_id: id,
                    modified: meta.last_modified.into(),
                })
            })
            .collect())
    }
}

/// Whether `e` says there is no such object: a 404 for the key, not for the bucket (S3's
/// `NoSuchBucket` is also a 404, and it is a failing store, not a missing artifact).
fn no_object(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. }) && !format!("{e:?}").contains("NoSuchBucket")
}

/// Run `f` on the I/O runtime from a thread of the core.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    Ok(io_runtime()?.block_on(f))
}
