//! The watch cache: per configured resource, a store of current objects
//! and recent events fed by one upstream list+watch, answering list, get
//! and watch exactly as kube-apiserver would (see [`serve`]).

// The shared core, which both sides use.
pub mod compaction;
pub mod encode;
pub mod event;
pub mod filter;
pub mod metrics;
pub mod negotiate;
pub mod object;
pub mod probe;
pub mod resource;
pub mod status;
pub mod store;

// What reads upstream and keeps the cache right.
pub mod ingest;
// What answers clients from it.
pub mod serve;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::component::config::{CacheConfig, ConfigError};
use crate::component::ready::Readiness;
use crate::upstream::Upstream;
use apimachinery::resource::{FieldSet, Gvr, built_in, is_built_in_group};

use self::ingest::reflector::Reflector;
use self::ingest::{checker, persist, silence};
use self::metrics::CacheMetrics;
use self::resource::{ReadSettings, ResourceCache, ResourceInfo, Siblings};
use self::store::Settings;

/// Every configured resource's cache, by group, version and resource.
#[derive(Debug, Default)]
pub struct Caches {
    by_gvr: HashMap<(String, String, String), Arc<ResourceCache>>,
}

// === impl Caches ===

impl Caches {
    /// Builds an (empty) cache per configured resource.
    ///
    /// # Errors
    /// [`ConfigError`] for a resource that cannot be cached.
    pub fn new(
        config: &CacheConfig,
        node_name: &str,
        identity: &crate::upstream::identity::Identity,
        metrics: &CacheMetrics,
    ) -> Result<Caches, ConfigError> {
        let mut by_gvr = HashMap::new();
        if !config.enabled {
            return Ok(Caches { by_gvr });
        }
        let read = ReadSettings {
            bookmark_interval: Duration::from_secs(config.bookmark_interval_seconds),
            min_request_timeout: Duration::from_secs(config.min_request_timeout_seconds),
            consistent_list_wait: Duration::from_millis(config.consistent_list_wait_milliseconds),
            large_list_objects: config.large_list_objects,
            large_list_wait: Duration::from_millis(config.large_list_wait_milliseconds),
            consistent_watch_wait: Duration::from_millis(config.consistent_watch_wait_milliseconds),
            progress_roll: Duration::from_secs(config.progress_watch_roll_seconds),
            watch_batch: Duration::from_millis(config.watch_batch_milliseconds),
            not_older_than_wait: Duration::from_millis(config.not_older_than_wait_milliseconds),
            ready_wait: Duration::from_millis(config.ready_wait_milliseconds),
        };
        let forms = encode::ProtoForms::new(
            config.protobuf_cache_mib.saturating_mul(1 << 20),
            config.protobuf_cache_percent,
        );
        for (i, r) in config.resources.iter().enumerate() {
            let known = built_in(&r.group, &r.version, &r.resource);
            let kind = r
                .kind
                .clone()
                .or_else(|| known.map(|b| b.kind.to_string()))
                .ok_or_else(|| invalid(i, "kind", "required"))?;
            let namespaced = r
                .namespaced
                .or_else(|| known.map(|b| b.namespaced))
                .ok_or_else(|| invalid(i, "namespaced", "required"))?;
            let field_set = FieldSet::of(&r.group, &r.version, &r.resource);
            let scope = r
                .scope(node_name)
                .map_err(|m| invalid(i, "fieldSelector", &m))?;
            let api_version = if r.group.is_empty() {
                r.version.clone()
            } else {
                format!("{}/{}", r.group, r.version)
            };
            let resource_metrics = metrics.resource(&r.group, &r.resource);
            let codec = is_built_in_group(&r.group)
                .then(|| {
                    encode::ProtoCodec::new(
                        &r.group,
                        &r.version,
                        &kind,
                        &api_version,
                        resource_metrics.protobuf_bytes.clone(),
                        resource_metrics.encode_failures.clone(),
                        forms.for_resource(u32::try_from(i).unwrap_or(u32::MAX)),
                    )
                })
                .flatten()
                .map(Arc::new);
            let info = ResourceInfo {
                gvr: Gvr {
                    group: r.group.clone(),
                    version: r.version.clone(),
                    resource: r.resource.clone(),
                },
                kind,
                api_version,
                namespaced,
                field_set,
                strip_item_type_meta: is_built_in_group(&r.group),
                scope,
                reads_as: identity.reads_as(&r.group, &r.resource),
                upstream_protobuf: codec.is_some()
                    && config.upstream_encoding
                        == crate::component::config::UpstreamEncoding::Protobuf,
                codec,
            };
            let store = Settings {
                history_capacity: r.history_capacity.unwrap_or(config.history_capacity),
                history_max_age: Duration::from_secs(
                    r.history_max_age_seconds
                        .unwrap_or(config.history_max_age_seconds),
                ),
                watcher_buffer: config.watcher_buffer_events,
                blocked_budget: Duration::from_secs(config.slow_watcher_timeout_seconds),
                node_indexed: field_set == FieldSet::Pod,
                namespaced,
                field_set,
                history_bytes: Some(resource_metrics.history_bytes.clone()),
            };
            let cache = ResourceCache::new(info, store, read.clone(), resource_metrics);
            by_gvr.insert(
                (r.group.clone(), r.version.clone(), r.resource.clone()),
                Arc::new(cache),
            );
        }
        Siblings::join(by_gvr.values());
        Ok(Caches { by_gvr })
    }

    /// The cache stage of [`crate::run`]: a cache per resource of
    /// `config.cache`, scoped to what the proxy's `identity` may read
    /// (a node proxy's pods and node: its own), each filled by a reflector
    /// (resumed from its snapshot, with `cache.persistence`) and checked
    /// by a consistency checker; and the persister that writes the
    /// snapshots, to be run.
    ///
    /// # Errors
    /// [`ConfigError`] for a resource that cannot be cached, or cannot be
    /// scoped to the identity.
    pub fn start(
        config: &crate::component::config::Config,
        identity: &crate::upstream::identity::Identity,
        metrics: &CacheMetrics,
        upstream: &Upstream,
        kube_config: &kube::Config,
        readiness: &Readiness,
        shutdown: &CancellationToken,
    ) -> Result<(Caches, Option<Arc<persist::Persister>>), ConfigError> {
        let mut cache_config = config.cache.clone();
        identity
            .scope_caches(&mut cache_config)
            .map_err(|message| ConfigError::Invalid {
                field: "cache.resources".into(),
                message,
            })?;
        let caches = Caches::new(&cache_config, &config.node_name, identity, metrics)?;
        let snapshots = persist::Snapshots::open(&config.cache.persistence, kube_config);
        caches.spawn_reflectors(
            upstream,
            readiness,
            snapshots.as_ref(),
            &config.cache.consistency_check,
            shutdown,
        );
        let persister = snapshots
            .map(|s| Arc::new(persist::Persister::new(s, caches.iter().cloned().collect())));
        Ok((caches, persister))
    }

    /// The cache for a group, version and resource.
    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<&Arc<ResourceCache>> {
        self.by_gvr
            .get(&(group.to_string(), version.to_string(), resource.to_string()))
    }

    /// Every cache.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<ResourceCache>> {
        self.by_gvr.values()
    }

    /// Starts one reflector per cache, resuming from `snapshots` where
    /// they hold a usable snapshot, and its consistency checker.
    pub fn spawn_reflectors(
        &self,
        upstream: &Upstream,
        readiness: &Readiness,
        snapshots: Option<&Arc<persist::Snapshots>>,
        check: &crate::component::config::ConsistencyCheckConfig,
        shutdown: &CancellationToken,
    ) {
        // One watchdog for the connections every reflector shares, probing
        // with the resource first in order.
        if let Some(cache) = self
            .by_gvr
            .values()
            .min_by_key(|c| c.info().gvr.resource.clone())
        {
            tokio::spawn(silence::watchdog(
                upstream.clone(),
                cache.clone(),
                shutdown.clone(),
            ));
        }
        for cache in self.by_gvr.values() {
            tokio::spawn(
                checker::Checker {
                    cache: cache.clone(),
                    upstream: upstream.clone(),
                    shutdown: shutdown.clone(),
                    period: Duration::from_secs(check.period_seconds),
                    page_size: check.page_size,
                }
                .run(),
            );
            let reflector = Reflector {
                cache: cache.clone(),
                upstream: upstream.clone(),
                readiness: readiness.clone(),
                shutdown: shutdown.clone(),
                snapshots: snapshots.cloned(),
            };
            tokio::spawn(reflector.run());
        }
    }
}

fn invalid(i: usize, field: &str, message: &str) -> ConfigError {
    ConfigError::Invalid {
        field: format!("cache.resources[{i}].{field}"),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_overrides_the_history_bounds() {
        let config = crate::component::config::Config::from_yaml(
            "cache:\n  resources:\n  - {version: v1, resource: pods}\n  - {group: discovery.k8s.io, version: v1, resource: endpointslices, historyCapacity: 50, historyMaxAgeSeconds: 75}\n",
        )
        .unwrap();
        let metrics = CacheMetrics::new(&prometheus::Registry::new()).unwrap();
        let identity = crate::upstream::identity::Identity::AsGiven;
        let caches = Caches::new(&config.cache, "", &identity, &metrics).unwrap();
        let bounds = |group: &str, resource: &str| {
            caches.get(group, "v1", resource).unwrap().history_bounds()
        };
        assert_eq!(bounds("", "pods"), (10_000, Duration::from_secs(300)));
        assert_eq!(
            bounds("discovery.k8s.io", "endpointslices"),
            (50, Duration::from_secs(75))
        );
    }
}
