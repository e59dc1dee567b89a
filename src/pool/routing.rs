//! Routing by size class: which pool first accepts a size, looked up instead of
//! asking every pool.
//!
//! Memory management sends a size to the first pool whose [`AcceptRule`] serves it.
//! Asking the pools in turn costs a few comparisons per pool on every reserve of a
//! new size. A [`RouteTable`] answers for a whole size class at once (the classes of
//! the free lists, eight per power of two): when every size of a class goes to the
//! same pool, or to none, the table holds that answer; a class that straddles a
//! boundary of some rule is marked mixed, and only its sizes ask the pools.
//!
//! Invariant (checked by the tests against asking the pools): for every positive
//! size, [`RouteTable::lookup`] answers either what asking the pools in order
//! answers, or [`Route::Ask`].

use super::bins::{class_bounds, class_of, CLASSES};
use super::AcceptRule;

/// What the table knows about a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Pool `index` is the first that accepts it.
    Pool(usize),
    /// No pool accepts it.
    Refused,
    /// Its class straddles a boundary: ask the pools.
    Ask,
}

/// Marks a class whose sizes no pool accepts.
const REFUSED: u8 = u8::MAX - 1;
/// Marks a class whose sizes do not all route alike.
const MIXED: u8 = u8::MAX;
// Every pool index a configuration can hold is a route below the two marks.
const _: () = assert!(crate::config::MAX_POOLS <= REFUSED as usize);

/// The first accepting pool of every size class (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct RouteTable {
    routes: Box<[u8; CLASSES]>,
}

impl RouteTable {
    /// The table for pools with these accept rules, in routing order. Pools past
    /// index 253 (more than `MAX_POOLS` allows) are left to asking.
    pub(crate) fn new(rules: &[AcceptRule]) -> Self {
        let mut routes = Box::new([MIXED; CLASSES]);
        for (class, route) in routes.iter_mut().enumerate() {
            let Some((low, high)) = class_bounds(class) else {
                continue;
            };
            if rules.iter().any(|rule| !rule.is_uniform_on(low, high)) {
                continue;
            }
            *route = match rules.iter().position(|rule| rule.accepts(low)) {
                Some(index) => u8::try_from(index)
                    .ok()
                    .filter(|&index| index < REFUSED)
                    .unwrap_or(MIXED),
                None => REFUSED,
            };
        }
        Self { routes }
    }

    /// What the table knows about `size` (positive).
    #[inline]
    pub(crate) fn lookup(&self, size: u64) -> Route {
        match self.routes[class_of(size)] {
            MIXED => Route::Ask,
            REFUSED => Route::Refused,
            index => Route::Pool(index as usize),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The answer of asking the pools in order.
    fn asked(rules: &[AcceptRule], size: u64) -> Route {
        rules
            .iter()
            .position(|rule| rule.accepts(size))
            .map_or(Route::Refused, Route::Pool)
    }

    fn agrees(rules: &[AcceptRule], table: &RouteTable, size: u64) -> Result<(), String> {
        match table.lookup(size) {
            Route::Ask => Ok(()),
            known if known == asked(rules, size) => Ok(()),
            known => Err(format!(
                "size {size}: table says {known:?}, pools say {:?}",
                asked(rules, size)
            )),
        }
    }

    /// Every size at and around each boundary of `rules`, and each class's ends.
    fn edges(rules: &[AcceptRule]) -> Vec<u64> {
        let mut points = Vec::new();
        for rule in rules {
            points.push(rule.max_size);
            if let Some(page) = rule.near_page {
                points.extend([page, page / 5, page - page / 5]);
            }
        }
        for class in 0..CLASSES {
            if let Some((low, high)) = class_bounds(class) {
                points.extend([low, high]);
            }
        }
        points
            .into_iter()
            .flat_map(|point| [point.saturating_sub(1), point, point.saturating_add(1)])
            .filter(|&size| size > 0)
            .collect()
    }

    /// The lowest size of a class that holds sizes, in `16..=class_of(u64::MAX)`.
    fn class_low(class: usize) -> u64 {
        class_bounds(class).map_or(0, |(low, _)| low)
    }

    /// Sizes for rules: small, large, any, and sizes that put a boundary of a rule
    /// right at or next to the lowest size of a class (where an off-by-one in
    /// `is_uniform_on` would show).
    fn rule_size() -> impl Strategy<Value = u64> {
        let at_class = (16usize..=class_of(u64::MAX), 0u64..3);
        prop_oneof![
            0u64..4096,
            0u64..(1 << 40),
            any::<u64>(),
            // `max_size + 1` at a class's low end.
            at_class
                .clone()
                .prop_map(|(class, step)| (class_low(class) - 1).saturating_add(step) - 1),
            // The near-page run's low end, `page - (page - 1) / 5`, at a class's low end.
            at_class.prop_map(|(class, step)| {
                (class_low(class).saturating_mul(5) / 4).saturating_add(step) - 1
            }),
        ]
    }

    fn rule() -> impl Strategy<Value = AcceptRule> {
        (rule_size(), proptest::option::of(rule_size())).prop_map(|(max_size, near_page)| {
            AcceptRule {
                max_size,
                near_page,
            }
        })
    }

    #[test]
    fn small_rules_route_like_their_pools_at_every_size() {
        for page in 1..=700u64 {
            for max_size in [0, page / 3, page / 2] {
                let rules = [
                    AcceptRule {
                        max_size,
                        near_page: Some(page),
                    },
                    AcceptRule::up_to(1000),
                ];
                let table = RouteTable::new(&rules);
                for size in 1..=1100 {
                    agrees(&rules, &table, size).unwrap();
                }
            }
        }
    }

    #[test]
    fn the_sub_slices_ladder_routes_like_its_pools() {
        let mib = 1 << 20;
        let sliced = |page: u64, max: u64| AcceptRule {
            max_size: max,
            near_page: Some(page),
        };
        let rules = [
            AcceptRule::up_to(0),
            sliced(8 * mib, mib / 2),
            sliced(32 * mib, 4 * mib),
            sliced(128 * mib, 32 * mib),
            sliced(512 * mib, 256 * mib),
            AcceptRule::up_to(2048 * mib),
        ];
        let table = RouteTable::new(&rules);
        for size in edges(&rules) {
            agrees(&rules, &table, size).unwrap();
        }
        // Only the classes holding a boundary (at most three per rule) ask, besides
        // the classes no size maps to.
        let asking = (0..CLASSES)
            .filter(|&class| table.routes[class] == MIXED)
            .count();
        let empty = CLASSES - 1 - class_of(u64::MAX);
        assert!(asking <= 3 * rules.len() + empty, "{asking} classes ask");
        assert_eq!(table.lookup(100), Route::Pool(1));
        assert_eq!(table.lookup(3 * mib), Route::Pool(2));
        assert_eq!(table.lookup(7 * mib), Route::Pool(1), "near 8 MiB page");
        assert_eq!(table.lookup(4096 * mib), Route::Refused);
    }

    proptest! {
        #[test]
        fn the_table_never_contradicts_the_pools(
            rules in proptest::collection::vec(rule(), 1..6),
            sizes in proptest::collection::vec(1u64.., 64),
        ) {
            let table = RouteTable::new(&rules);
            for size in edges(&rules).into_iter().chain(sizes) {
                let verdict = agrees(&rules, &table, size);
                prop_assert!(verdict.is_ok(), "{:?}", verdict);
            }
        }
    }
}
