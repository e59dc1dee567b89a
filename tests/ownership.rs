//! A handle names memory only in the memory management that made it: every API that
//! takes one refuses another's, so a foreign id never reaches the error graph.

mod common;

use cubepool::errors::{AllocId, LaunchOutcome};
use cubepool::PoolError;

#[test]
fn alloc_ids_and_resources_refuse_foreign_handles() {
    let (mut a, mut b) = (common::host_memory(), common::host_memory());
    let mine = a.reserve(64).unwrap();
    let theirs = b.reserve(64).unwrap();
    assert_eq!(a.alloc_id(&mine).unwrap(), AllocId(mine.id().0));
    assert_eq!(a.alloc_id(&mine.binding()).unwrap(), AllocId(mine.id().0));
    for refused in [a.alloc_id(&theirs), a.alloc_id(&theirs.binding())] {
        assert!(
            matches!(refused, Err(PoolError::NotFound { ref reason }) if reason.contains("another")),
            "{refused:?}"
        );
    }
    assert!(a.resource(&theirs).is_err());
    // A failure recorded through checked ids leaves the graph when its carrier goes.
    let id = a.alloc_id(&mine).unwrap();
    let outcome = a
        .error_graph_mut()
        .launch("k", &[], &[(id, 0..64)], Some("boom".into()))
        .unwrap();
    assert!(matches!(outcome, LaunchOutcome::Failed(_)));
    a.release(mine);
    let _ = a.reserve(8).unwrap(); // the next operation processes the release
    assert!(a.error_graph().is_empty());
    drop(theirs);
}
