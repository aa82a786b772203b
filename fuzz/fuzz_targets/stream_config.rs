//! Stream configuration files (TOML, `loci stream send|recv --config`): `SenderConfig` and
//! `ReceiverConfig` as `config::load` parses them, `validate` (twice: the same verdict), the
//! receiver's per-stream lookup, and `to_toml` printing back to the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_stream::config::{ReceiverConfig, SenderConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return; // `config::load` reads the file as UTF-8 text and stops on anything else
    };
    if let Ok(c) = toml::from_str::<SenderConfig>(s) {
        let v = c.validate().map_err(|e| e.to_string());
        assert_eq!(
            v,
            c.validate().map_err(|e| e.to_string()),
            "validate is not deterministic"
        );
        let printed = c.to_toml();
        let back: SenderConfig = toml::from_str(&printed).unwrap_or_else(|e| {
            panic!("to_toml of a parsed config does not parse: {e}\n{printed}")
        });
        assert_eq!(back, c, "sender config changed through to_toml:\n{printed}");
        assert_eq!(back.validate().map_err(|e| e.to_string()), v);
        let _ = c.unpinned().validate();
    }
    if let Ok(c) = toml::from_str::<ReceiverConfig>(s) {
        let v = c.validate().map_err(|e| e.to_string());
        assert_eq!(
            v,
            c.validate().map_err(|e| e.to_string()),
            "validate is not deterministic"
        );
        let printed = c.to_toml();
        let back: ReceiverConfig = toml::from_str(&printed).unwrap_or_else(|e| {
            panic!("to_toml of a parsed config does not parse: {e}\n{printed}")
        });
        assert_eq!(
            back, c,
            "receiver config changed through to_toml:\n{printed}"
        );
        if v.is_ok() {
            for s in c.streams.iter().take(8) {
                let part = c.part(s.id, 4).expect("a configured stream has a part");
                assert_eq!(part.id, s.id);
            }
            let _ = c.part(u32::MAX, 1);
        }
    }
});
