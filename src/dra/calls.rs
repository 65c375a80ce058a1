//! API calls of the DRA plugin: each try bounded in time, transient failures
//! retried under the Node writer's policy (the one retry policy of the
//! agent's API writes).

use std::future::Future;
use std::time::Duration;

use crate::node_writer::{is_transient, retry_policy};

/// Bound on one try of one API call.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// One API call under the Node writer's retry policy, each try bounded.
pub async fn with_retries<T, F, Fut>(call: F) -> Result<T, kube::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    use backon::Retryable;
    let bounded = || async {
        match tokio::time::timeout(API_TIMEOUT, call()).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {API_TIMEOUT:?}"),
            )))),
        }
    };
    bounded.retry(retry_policy()).when(is_transient).await
}
