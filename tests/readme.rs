//! The README's Rust example, run as written: the README's `rust` block is this file's
//! `use` line and the body of `the_readme_rust_example_runs` between its markers, and
//! `the_readme_rust_block_is_this_example` checks that they agree.

#[cfg(not(feature = "exclusive-memory-only"))]
use cubepool::{HostStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement};

// A build with `exclusive-memory-only` has exclusive pools alone: the README's
// example asks for the sliced pools' preset, which such a build refuses.
#[cfg(not(feature = "exclusive-memory-only"))]
#[test]
fn the_readme_rust_example_runs() -> Result<(), Box<dyn std::error::Error>> {
    // README begin
    let mut mm = MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::SubSlices,
    )?;
    let handle = mm.reserve(1 << 20)?;
    // Pool, storage id, offset, address.
    let resource = mm.resource(&handle)?;
    // Freed at the next operation.
    drop(handle);
    let handle = mm.reserve(4096)?;
    // Freed now, without atomic operations.
    mm.release(handle);
    // README end
    assert_eq!(resource.size, 1 << 20);
    assert_eq!(mm.memory_usage().number_allocs, 0, "both blocks were freed");
    Ok(())
}

/// The README's one `rust` block is this file's `use` line, a blank line and the
/// example's body above (less its indentation).
#[test]
fn the_readme_rust_block_is_this_example() {
    let readme = include_str!("../README.md");
    let (_, after) = readme
        .split_once("```rust\n")
        .expect("the README has a rust block");
    let (block, rest) = after.split_once("```").expect("the block ends");
    assert!(!rest.contains("```rust\n"), "one rust block only");
    let source = include_str!("readme.rs");
    let use_line = source
        .lines()
        .find(|line| line.starts_with("use cubepool::"))
        .unwrap();
    let (_, body) = source.split_once("    // README begin\n").unwrap();
    let (body, _) = body.split_once("    // README end\n").unwrap();
    let body: String = body
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    assert_eq!(block, format!("{use_line}\n\n{body}"));
}
