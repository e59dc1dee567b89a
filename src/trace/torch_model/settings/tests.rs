//! Tests of the settings: PyTorch's spelling read, printed back, and refused.

use super::*;
use proptest::prelude::*;

#[test]
fn settings_read_pytorch_spelling_and_print_back() {
    let parse = |text: &str| TorchSettings::parse(text);
    assert_eq!(parse("torch"), Ok(TorchSettings::default()));
    assert_eq!(parse(" Torch-Expandable "), Ok(TorchSettings::expandable()));
    assert_eq!(
        parse("torch(expandable_segments:True)"),
        Ok(TorchSettings::expandable())
    );
    let full =
        parse("torch_expandable(max_split_size_mb=128, roundup_power2_divisions:8)").unwrap();
    assert_eq!(full.max_split_size, Some(128 * MIB));
    assert_eq!(full.roundup_power2_divisions, [8; ROUNDUP_INTERVALS]);
    assert_eq!(
        full.to_string(),
        "torch_expandable(max_split_size_mb=128, roundup_power2_divisions=8)"
    );
    assert_eq!(parse(&full.to_string()), Ok(full));
    assert!(matches!(
        parse("tensorflow"),
        Err(TorchSettingsError::UnknownModel { .. })
    ));
    assert!(matches!(
        parse("torch(foo=1)"),
        Err(TorchSettingsError::UnknownOption { .. })
    ));
    // 20 is PyTorch's least (its older releases refused 20 too: helper-140's find).
    assert!(matches!(
        parse("torch(max_split_size_mb=19)"),
        Err(TorchSettingsError::MaxSplitSizeTooSmall { mb: 19 })
    ));
    assert_eq!(
        parse("torch(max_split_size_mb=20)").map(|s| s.max_split_size_mb()),
        Ok(Some(20))
    );
    // True and False exactly, as PyTorch's `toBool` reads them.
    for value in ["true", "TRUE", "false"] {
        assert!(matches!(
            parse(&format!("torch(expandable_segments={value})")),
            Err(TorchSettingsError::InvalidValue { .. })
        ));
    }
    assert_eq!(
        parse("torch(expandable_segments:True)"),
        Ok(TorchSettings::expandable())
    );
    assert!(matches!(
        parse("torch(roundup_power2_divisions=3)"),
        Err(TorchSettingsError::DivisionsNotPowerOfTwo { divisions: 3 })
    ));
    assert!(matches!(
        parse("torch(max_split_size_mb=x)"),
        Err(TorchSettingsError::InvalidValue { .. })
    ));
    assert!(matches!(
        parse("torch(expandable_segments=yes)"),
        Err(TorchSettingsError::InvalidValue { .. })
    ));
    assert!(matches!(
        parse("torch(max_split_size_mb=64"),
        Err(TorchSettingsError::Syntax { .. })
    ));
    assert!(matches!(
        parse("torch(64)"),
        Err(TorchSettingsError::Syntax { .. })
    ));
}

#[test]
fn intervals_are_powers_of_two_of_mib_from_1_mib_to_32_gib() {
    // PyTorch's `roundup_power2_divisions(size)`: floor(log2(size)) - 20, clamped.
    for (size, interval) in [
        (0, 0),
        (512, 0),
        (MIB, 0),
        (2 * MIB - 1, 0),
        (2 * MIB, 1),
        (4 * MIB - 1, 1),
        (256 * MIB, 8),
        (32 << 30, 15),
        (1 << 40, 15),
        (u64::MAX, 15),
    ] {
        assert_eq!(roundup_interval(size), interval, "{size}");
    }
}

/// The divisions a name gives sizes of `mib` MiB.
fn divisions_at(text: &str, mib: u64) -> u64 {
    TorchSettings::parse(text)
        .unwrap()
        .roundup_power2_divisions_for(mib * MIB)
}

#[test]
fn the_list_form_reads_as_pytorch_reads_it() {
    // PyTorch's own cases (c10/test/core/AllocatorConfig_test.cpp), size in MiB ->
    // divisions: the first entry fills the intervals below it, `>` those after the
    // last entry, and an interval no entry sets (1024 MiB below) stays 0.
    let text = "torch(roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1])";
    for (mib, divisions) in [
        (32, 8),
        (64, 8),
        (128, 2),
        (256, 4),
        (512, 2),
        (1024, 4),
        (2048, 1),
        (4096, 1),
        (8192, 1),
    ] {
        assert_eq!(divisions_at(text, mib), divisions, "{mib} MiB");
    }
    let text = "torch(roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2])";
    for (mib, divisions) in [
        (64, 8),
        (128, 8),
        (256, 16),
        (512, 1),
        (1024, 0),
        (2048, 8),
        (4096, 2),
    ] {
        assert_eq!(divisions_at(text, mib), divisions, "{mib} MiB");
    }
    // `>` after the last numeric entry, not from it (PyTorch's older parser filled
    // from it): 256 MiB keeps 1.
    let list = TorchSettings::parse(
        "torch_expandable(roundup_power2_divisions=[256:1,>:8], max_split_size_mb=512)",
    )
    .unwrap();
    assert!(list.expandable_segments);
    assert_eq!(list.max_split_size_mb(), Some(512));
    let mut table = [1; ROUNDUP_INTERVALS];
    table[9..].fill(8);
    assert_eq!(list.roundup_power2_divisions, table);
    // `>` first: there is no last entry, so it fills from interval 1, and a later first
    // numeric entry still fills below it.
    let mut table = [8; ROUNDUP_INTERVALS];
    table[0] = 0;
    let parse = |text: &str| TorchSettings::parse(text).map(|s| s.roundup_power2_divisions);
    assert_eq!(parse("torch(roundup_power2_divisions=[>:8])"), Ok(table));
    table[..=2].fill(2);
    assert_eq!(
        parse("torch(roundup_power2_divisions=[>:8,4:2])"),
        Ok(table)
    );
    // Intervals past 32 GiB are the last; spaces, 0 entries and a trailing comma are
    // taken; an empty list sets nothing.
    let mut table = [0; ROUNDUP_INTERVALS];
    table[15] = 4;
    assert_eq!(
        parse("torch(roundup_power2_divisions=[ 1:0 , 65536:4 ,])"),
        Ok(table)
    );
    assert_eq!(
        parse("torch(roundup_power2_divisions=[])"),
        Ok([0; ROUNDUP_INTERVALS])
    );
    // A list after the scalar changes only what it names (as PyTorch's does).
    let mut table = [4; ROUNDUP_INTERVALS];
    table[..=1].fill(1);
    assert_eq!(
        parse("torch(roundup_power2_divisions=4, roundup_power2_divisions=[2:1])"),
        Ok(table)
    );
}

#[test]
fn bad_lists_are_refused_naming_the_entry() {
    let parse = |text: &str| {
        TorchSettings::parse(&format!("torch(roundup_power2_divisions={text})")).unwrap_err()
    };
    assert_eq!(
        parse("[256:3]"),
        TorchSettingsError::EntryDivisionsInvalid {
            interval: "256".into(),
            divisions: 3
        }
    );
    assert_eq!(
        parse("[256:1,>:6]"),
        TorchSettingsError::EntryDivisionsInvalid {
            interval: ">".into(),
            divisions: 6
        }
    );
    assert_eq!(
        parse("[3:1]"),
        TorchSettingsError::IntervalNotPowerOfTwo { interval_mb: 3 }
    );
    assert_eq!(
        parse("[0:1]"),
        TorchSettingsError::IntervalNotPowerOfTwo { interval_mb: 0 }
    );
    for bad in [
        "[256]",
        "[x:1]",
        "[256:x]",
        "[256:-1]",
        "[,]",
        "[256:1,,>:2]",
        "[<:2]",
    ] {
        assert!(
            matches!(parse(bad), TorchSettingsError::InvalidValue { .. }),
            "{bad}: {:?}",
            parse(bad)
        );
    }
    for bad in ["[256:1", "256:1]", "[256:1]]", "[[256:1]", "[256:1]x"] {
        let error = parse(bad);
        assert!(
            matches!(
                error,
                TorchSettingsError::Syntax { .. } | TorchSettingsError::InvalidValue { .. }
            ),
            "{bad}: {error:?}"
        );
    }
    assert!(matches!(parse("[256:1"), TorchSettingsError::Syntax { .. }));
    assert!(matches!(parse("256:1]"), TorchSettingsError::Syntax { .. }));
    assert!(parse("[256:3]").to_string().contains("256:3"));
    // The table setter checks each entry too (0 is taken there, not in the scalar).
    let mut table = [0; ROUNDUP_INTERVALS];
    table[3] = 12;
    assert_eq!(
        TorchSettings::default().with_roundup_power2_divisions_table(table),
        Err(TorchSettingsError::EntryDivisionsInvalid {
            interval: "8".into(),
            divisions: 12
        })
    );
    assert!(matches!(
        TorchSettings::default().with_roundup_power2_divisions(Some(0)),
        Err(TorchSettingsError::DivisionsNotPowerOfTwo { divisions: 0 })
    ));
}

#[test]
fn tables_print_as_one_number_or_a_list_that_reads_back() {
    let name = |text: &str| TorchSettings::parse(text).unwrap().to_string();
    // The same everywhere: the scalar form; 0 everywhere is the default, unsaid.
    assert_eq!(
        name("torch(roundup_power2_divisions=[1:4,>:4])"),
        "torch(roundup_power2_divisions=4)"
    );
    assert_eq!(name("torch(roundup_power2_divisions=[1:0,>:0])"), "torch");
    // PyTorch's spellings print as written.
    for text in [
        "torch_expandable(max_split_size_mb=512, roundup_power2_divisions=[256:1,>:8])",
        "torch(roundup_power2_divisions=[64:8,128:2,256:4,512:2,1024:4,>:1])",
        "torch(roundup_power2_divisions=[128:8,256:16,512:1,2048:8,>:2])",
        "torch(roundup_power2_divisions=[1:0,>:8])",
        "torch(roundup_power2_divisions=[1:2,4:4])",
    ] {
        assert_eq!(name(text), text);
    }
    // A setting's own defaults written out read as the shorter name.
    assert_eq!(
        name("torch(roundup_power2_divisions=[8:1,16:0,32:0,>:4])"),
        "torch(roundup_power2_divisions=[8:1,32:0,>:4])"
    );
}

fn division() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(4),
        Just(8),
        Just(1 << 40),
        Just(1 << 63)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any table of divisions prints as a name that reads back to it.
    #[test]
    fn any_table_round_trips_through_its_name(
        table in prop::array::uniform16(division()),
        expandable in any::<bool>(),
        max_split in prop::option::of(20u64..4096),
    ) {
        let settings = TorchSettings { expandable_segments: expandable, ..TorchSettings::default() }
            .with_max_split_size_mb(max_split).unwrap()
            .with_roundup_power2_divisions_table(table).unwrap();
        let name = settings.to_string();
        prop_assert_eq!(TorchSettings::parse(&name), Ok(settings), "{}", name);
    }
}
