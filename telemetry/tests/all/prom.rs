//! A small reader of the Prometheus text format, for assertions.

/// One sample line: metric name, labels in file order, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses every sample line of `text` (comments and blank lines skipped).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("sample line has a value");
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("labels end with }");
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once("=\"").expect("label is k=\"v\"");
                            (k.to_owned(), v.trim_end_matches('"').to_owned())
                        })
                        .collect();
                    (name, labels)
                }
                None => (series, Vec::new()),
            };
            Sample {
                name: name.to_owned(),
                labels,
                value,
            }
        })
        .collect()
}

/// The samples named `name` whose labels include all of `want`.
pub fn matching(text: &str, name: &str, want: &[(&str, &str)]) -> Vec<Sample> {
    samples(text)
        .into_iter()
        .filter(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .collect()
}

/// The value of the one sample named `name` with labels including `want`;
/// `None` if there is none, a panic if there are several.
pub fn value(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let found = matching(text, name, want);
    assert!(
        found.len() <= 1,
        "{name} {want:?} is ambiguous: {found:?}\n{text}"
    );
    found.first().map(|s| s.value)
}

/// The `# TYPE` of `name`.
pub fn type_of<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("# TYPE {name} ");
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

#[test]
fn the_reader_reads_labels_and_values() {
    let text =
        "# TYPE a_total counter\na_total{x=\"1\",y=\"two\"} 3\nb 1.5\nc_bucket{le=\"+Inf\"} 2\n";
    assert_eq!(value(text, "a_total", &[("y", "two")]), Some(3.0));
    assert_eq!(value(text, "b", &[]), Some(1.5));
    assert_eq!(value(text, "c_bucket", &[("le", "+Inf")]), Some(2.0));
    assert_eq!(value(text, "a_total", &[("y", "one")]), None);
    assert_eq!(type_of(text, "a_total"), Some("counter"));
}
