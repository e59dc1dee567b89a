//! Tests of the settings: PyTorch's spelling read, printed back, and refused.

use super::*;

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
    assert_eq!(full.roundup_power2_divisions, Some(8));
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
