//! Property tests of the pools configuration language: every configuration reads
//! back from its text, and no text makes the parser panic.

use cubepool::{MemoryConfiguration, MemoryPoolOptions, PoolType};
use proptest::prelude::*;

/// Sizes of every shape: small, unit multiples (binary and decimal), anything.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..5000,
        (0u64..4096, 0u32..5).prop_map(|(n, k)| n << (10 * k)),
        (0u64..4096, 1u32..5).prop_map(|(n, k)| n * 1000u64.pow(k)),
        any::<u64>(),
    ]
}

fn pool() -> impl Strategy<Value = MemoryPoolOptions> {
    let pool_type = prop_oneof![
        (size(), size(), proptest::option::of(size())).prop_map(|(page, slice, cap)| {
            PoolType::SlicedPages {
                page_size: page,
                max_slice_size: slice,
                max_pool_size: cap,
            }
        }),
        // Valid sliced pools, so the round trip is exercised and not only refused.
        (
            1u64..1 << 40,
            1u64..=100,
            proptest::option::of(1u64..=65_535)
        )
            .prop_map(|(page, percent, pages)| PoolType::SlicedPages {
                page_size: page,
                max_slice_size: (page / 100 * percent).max(1),
                max_pool_size: pages.map(|pages| pages * page),
            }),
        size().prop_map(|max_alloc_size| PoolType::ExclusivePages { max_alloc_size }),
        proptest::option::of(size()).prop_map(|reclaim_at| PoolType::Direct { reclaim_at }),
        (size(), proptest::option::of(size()), size(), size()).prop_map(
            |(granule, keep, small, range)| {
                PoolType::VirtualPages {
                    granule,
                    keep,
                    small,
                    range,
                }
            }
        ),
        // Valid virtual pools (power-of-two granules, some fields at their defaults).
        (
            0u32..32,
            prop_oneof![
                Just(PoolType::VIRTUAL_KEEP),
                Just(None),
                size().prop_map(Some)
            ],
            proptest::option::of(size()),
            proptest::option::of(32u32..50),
        )
            .prop_map(|(shift, keep, small, range)| PoolType::VirtualPages {
                granule: 1 << shift,
                keep,
                small: small.unwrap_or(PoolType::VIRTUAL_SMALL),
                range: range.map_or(PoolType::VIRTUAL_RANGE, |shift| 1 << shift),
            }),
    ];
    (pool_type, proptest::option::of(any::<u64>())).prop_map(|(pool_type, dealloc_period)| {
        MemoryPoolOptions {
            pool_type,
            dealloc_period,
        }
    })
}

fn configuration() -> impl Strategy<Value = MemoryConfiguration> {
    prop_oneof![
        1 => Just(MemoryConfiguration::SubSlices),
        1 => Just(MemoryConfiguration::ExclusivePages),
        8 => proptest::collection::vec(pool(), 0..8)
            .prop_map(|pool_options| MemoryConfiguration::Custom { pool_options }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// `parse(str(c)) == c` for every valid configuration; an invalid one is refused
    /// with the error validation gives.
    #[test]
    fn text_round_trips(config in configuration()) {
        let text = config.to_string();
        let parsed = MemoryConfiguration::parse(&text).map_err(|e| e.error);
        prop_assert_eq!(parsed, config.validate().map(|()| config.clone()), "{}", text);
    }

    /// Any text is read or refused with a position inside it, never a panic.
    #[test]
    fn any_text_is_read_or_refused(text in "\\PC{0,80}") {
        if let Err(error) = MemoryConfiguration::parse(&text) {
            prop_assert!(error.position <= text.chars().count());
        }
    }

    /// Valid text with one character changed, inserted or removed is read or refused
    /// with a position inside it.
    #[test]
    fn mutated_text_is_read_or_refused(
        config in configuration(),
        at in any::<prop::sample::Index>(),
        edit in 0u8..3,
        c in prop_oneof![Just(';'), Just(','), Just('('), Just(')'), Just('='), Just('.'),
                         Just('_'), Just('#'), Just('\n'), Just('é'), any::<char>()],
    ) {
        let mut chars: Vec<char> = config.to_string().chars().collect();
        let i = at.index(chars.len() + 1);
        match edit {
            0 if i < chars.len() => chars[i] = c,
            1 if i < chars.len() => { chars.remove(i); }
            _ => chars.insert(i, c),
        }
        let text: String = chars.into_iter().collect();
        if let Err(error) = MemoryConfiguration::parse(&text) {
            prop_assert!(error.position <= text.chars().count(), "{:?}: {}", text, error);
        }
    }
}
