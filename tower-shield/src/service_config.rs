#![doc = include_str!("service_config/guide.md")]

mod codes;
mod config;
mod parse;
mod policy;
mod router;
mod stack;
mod throttle;

pub use codes::StatusCodes;
pub use config::{
    Adjustment, HedgingPolicy, MethodConfig, MethodName, RetryPolicy, RetryThrottling,
    ServiceConfig, ServiceConfigError,
};
pub use policy::A6Policy;
pub use router::MethodRouter;
pub use stack::{MethodService, ServiceConfigService, ServiceConfigStack, ServiceConfigTonic};
pub use throttle::RetryThrottle;
