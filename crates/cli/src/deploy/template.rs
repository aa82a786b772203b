//! The command template of `loci deploy`: `{name}` placeholders filled per instance, `{{` and
//! `}}` for literal braces. Parsed once before anything starts, so a bad placeholder is an error
//! naming it and the valid ones.

use std::ffi::OsString;

use anyhow::bail;

/// The placeholders a template may use, with what each becomes (for errors and `--help`).
pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("instance", "the instance's index, 0..N-1"),
    ("ninstances", "N, the number of instances"),
    (
        "node",
        "the instance's node (only where it sits on one node)",
    ),
    ("nodes", "the instance's nodes, as a list (0-1,3)"),
    ("cpus", "the instance's cpus, as a list"),
    ("ncpus", "how many cpus the instance has"),
    ("port", "--port-base + the instance's index"),
    ("nic", "the network device nearest the instance"),
    (
        "nic_node",
        "that device's node (-1 when the kernel does not say)",
    ),
];

fn valid() -> String {
    PLACEHOLDERS
        .iter()
        .map(|(n, _)| format!("{{{n}}}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Slot(&'static str),
}

/// A parsed template: one list of parts per argument.
#[derive(Debug, Clone)]
pub struct Template {
    args: Vec<Vec<Part>>,
}

/// What one instance fills in.
#[derive(Debug, Clone)]
pub struct Values {
    pub instance: usize,
    pub ninstances: usize,
    pub nodes: loci_topo::NodeSet,
    pub cpus: loci_topo::CpuSet,
    pub port: u16,
    pub nic: Option<(String, Option<u32>)>,
}

impl Template {
    /// Parses every argument; errors name the argument and the bad placeholder.
    pub fn parse(args: &[OsString]) -> anyhow::Result<Template> {
        let args = args
            .iter()
            .map(|a| {
                let s = a
                    .to_str()
                    .ok_or_else(|| anyhow::anyhow!("template argument {a:?} is not UTF-8"))?;
                parse_arg(s).map_err(|e| anyhow::anyhow!("template argument `{s}`: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Template { args })
    }

    /// The command line of one instance; errors say which placeholder has no value for it.
    pub fn expand(&self, v: &Values) -> anyhow::Result<Vec<String>> {
        self.args
            .iter()
            .map(|parts| {
                parts.iter().try_fold(String::new(), |mut s, p| {
                    match p {
                        Part::Text(t) => s.push_str(t),
                        Part::Slot(n) => s.push_str(&value(n, v)?),
                    }
                    Ok(s)
                })
            })
            .collect()
    }
}

fn value(name: &str, v: &Values) -> anyhow::Result<String> {
    let nic = || {
        v.nic.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "{{{name}}}: instance {} has no network device: the topology lists none (name them with --nics IF,...)",
                v.instance
            )
        })
    };
    Ok(match name {
        "instance" => v.instance.to_string(),
        "ninstances" => v.ninstances.to_string(),
        "node" => match (v.nodes.len(), v.nodes.first()) {
            (1, Some(n)) => n.to_string(),
            _ => bail!(
                "{{node}}: instance {} sits on nodes {} (not one node); use {{nodes}}",
                v.instance,
                v.nodes
            ),
        },
        "nodes" => v.nodes.to_string(),
        "cpus" => v.cpus.to_string(),
        "ncpus" => v.cpus.len().to_string(),
        "port" => v.port.to_string(),
        "nic" => nic()?.0.clone(),
        "nic_node" => nic()?.1.map_or("-1".to_string(), |n| n.to_string()),
        _ => unreachable!("placeholders are checked when parsed"),
    })
}

fn parse_arg(s: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '{' if it.peek() == Some(&'{') => {
                it.next();
                text.push('{');
            }
            '}' if it.peek() == Some(&'}') => {
                it.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                let mut closed = false;
                for c in it.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    name.push(c);
                }
                if !closed {
                    return Err(format!(
                        "`{{{name}` is not closed (a literal brace is written {{{{)"
                    ));
                }
                let slot = PLACEHOLDERS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(n, _)| *n)
                    .ok_or_else(|| format!("unknown placeholder {{{name}}}; valid: {}", valid()))?;
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Slot(slot));
            }
            '}' => return Err("a lone `}` (a literal brace is written }})".into()),
            c => text.push(c),
        }
    }
    if !text.is_empty() || parts.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> anyhow::Result<Template> {
        Template::parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    fn vals() -> Values {
        Values {
            instance: 2,
            ninstances: 4,
            nodes: loci_topo::NodeSet::single(2),
            cpus: loci_topo::CpuSet::parse("8-11").unwrap(),
            port: 20002,
            nic: Some(("eth1".into(), Some(2))),
        }
    }

    #[test]
    fn expands_every_placeholder() {
        let tpl = t(&[
            "w",
            "--id={instance}/{ninstances}",
            "{node}:{nodes}",
            "{cpus}x{ncpus}",
            "{port}",
            "{nic}@{nic_node}",
            "{{literal}}",
            "",
        ])
        .unwrap();
        assert_eq!(
            tpl.expand(&vals()).unwrap(),
            [
                "w",
                "--id=2/4",
                "2:2",
                "8-11x4",
                "20002",
                "eth1@2",
                "{literal}",
                ""
            ]
        );
    }

    #[test]
    fn bad_templates_name_the_problem() {
        let e = t(&["x", "--a={nodez}"]).unwrap_err().to_string();
        assert!(
            e.contains("{nodez}") && e.contains("--a={nodez}") && e.contains("{nic_node}"),
            "{e}"
        );
        let e = t(&["{node"]).unwrap_err().to_string();
        assert!(e.contains("not closed"), "{e}");
        let e = t(&["a}b"]).unwrap_err().to_string();
        assert!(e.contains("lone"), "{e}");
    }

    #[test]
    fn values_an_instance_lacks_are_errors() {
        let tpl = t(&["{node}"]).unwrap();
        let mut v = vals();
        v.nodes = loci_topo::NodeSet::parse("0-1").unwrap();
        let e = tpl.expand(&v).unwrap_err().to_string();
        assert!(e.contains("0-1") && e.contains("{nodes}"), "{e}");
        v.nic = None;
        let e = t(&["{nic_node}"])
            .unwrap()
            .expand(&v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--nics"), "{e}");
        v.nic = Some(("lo0".into(), None));
        assert_eq!(t(&["{nic_node}"]).unwrap().expand(&v).unwrap(), ["-1"]);
    }
}
