//! Stream configuration files (TOML, `loci stream send|recv --config`): `SenderConfig` and
//! `ReceiverConfig` as `config::load` parses them, `validate` (twice: the same verdict), the
//! receiver's per-stream lookup, and `to_toml` printing back to the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_stream::config::{ReceiverConfig, SenderConfig};

/// `text` parsed as a config `C`: `validate` gives the same verdict twice, and `to_toml` prints a
/// config that parses back to the same one with the same verdict. The config and its verdict.
fn checked<C>(
    text: &str,
    validate: impl Fn(&C) -> Result<(), String>,
    to_toml: impl Fn(&C) -> String,
) -> Option<(C, Result<(), String>)>
where
    C: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let c: C = toml::from_str(text).ok()?;
    let v = validate(&c);
    assert_eq!(v, validate(&c), "validate is not deterministic");
    let printed = to_toml(&c);
    let back: C = toml::from_str(&printed)
        .unwrap_or_else(|e| panic!("to_toml of a parsed config does not parse: {e}\n{printed}"));
    assert_eq!(back, c, "config changed through to_toml:\n{printed}");
    assert_eq!(validate(&back), v);
    Some((c, v))
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return; // `config::load` reads the file as UTF-8 text and stops on anything else
    };
    let sender = checked::<SenderConfig>(
        s,
        |c| c.validate().map_err(|e| e.to_string()),
        SenderConfig::to_toml,
    );
    if let Some((c, _)) = sender {
        let _ = c.unpinned().validate();
    }
    let receiver = checked::<ReceiverConfig>(
        s,
        |c| c.validate().map_err(|e| e.to_string()),
        ReceiverConfig::to_toml,
    );
    if let Some((c, v)) = receiver {
        if v.is_ok() {
            for s in c.streams.iter().take(8) {
                let part = c.part(s.id, 4).expect("a configured stream has a part");
                assert_eq!(part.id, s.id);
            }
            let _ = c.part(u32::MAX, 1);
        }
    }
});
