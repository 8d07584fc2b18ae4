//! What the forming stages' unit tests share: a [`Former`] over small lengths and explicit edges.

use crate::plan::buckets::Buckets;
use crate::plan::config::Config;
use crate::plan::form::stream::Former;
use crate::plan::rules::Rules;

/// Runs `test` with a former over `lengths` under `config` with bucket `edges`, and its rules.
pub(crate) fn with_former<T>(
    lengths: &[u32],
    edges: Vec<u32>,
    config: &Config,
    test: impl FnOnce(&Former<'_, u32>, &Rules) -> T,
) -> T {
    let buckets = Buckets::from_edges(edges).expect("valid edges");
    let longest = lengths.iter().copied().max().unwrap_or(1);
    let rules = Rules::new(&buckets, config, longest, longest);
    let bucket_capacity: Vec<u32> = (0..buckets.count()).map(|_| u32::MAX).collect();
    let former = Former {
        labels: None,
        lengths,
        config,
        rules: &rules,
        bucket_capacity: &bucket_capacity,
        companion_min: usize::MAX,
        general_only: false,
        shortest: 1,
        arranged: true,
    };
    test(&former, &rules)
}
