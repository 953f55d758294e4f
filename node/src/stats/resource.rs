//! `/metrics/resource` (upstream `pkg/kubelet/metrics/collectors/resource_metrics.go`): the
//! CPU and memory of the Summary's `GetCPUAndMemoryStats` as Prometheus text 0.0.4, the
//! metrics-server's source. Each sample carries the time its figure was read (milliseconds
//! since the epoch), as upstream's `NewLazyMetricWithTimestamp`; `resource_scrape_error` has
//! none. Values are formatted as Go's `strconv.FormatFloat(v, 'g', -1, 64)`.

#[cfg(test)]
use super::types::ContainerStats;
use super::types::{CpuStats, MemoryStats, PodStats, Summary, SwapStats};

/// The content type of Prometheus' text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

struct Desc {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    stability: &'static str,
}

const NODE_CPU: Desc = Desc {
    name: "node_cpu_usage_seconds_total",
    help: "Cumulative cpu time consumed by the node in core-seconds",
    kind: "counter",
    stability: "STABLE",
};
const NODE_MEMORY: Desc = Desc {
    name: "node_memory_working_set_bytes",
    help: "Current working set of the node in bytes",
    kind: "gauge",
    stability: "STABLE",
};
const NODE_SWAP: Desc = Desc {
    name: "node_swap_usage_bytes",
    help: "Current swap usage of the node in bytes. Reported only on non-windows systems",
    kind: "gauge",
    stability: "ALPHA",
};
const CONTAINER_CPU: Desc = Desc {
    name: "container_cpu_usage_seconds_total",
    help: "Cumulative cpu time consumed by the container in core-seconds",
    kind: "counter",
    stability: "STABLE",
};
const CONTAINER_MEMORY: Desc = Desc {
    name: "container_memory_working_set_bytes",
    help: "Current working set of the container in bytes",
    kind: "gauge",
    stability: "STABLE",
};
const CONTAINER_START: Desc = Desc {
    name: "container_start_time_seconds",
    help: "Start time of the container since unix epoch in seconds",
    kind: "gauge",
    stability: "STABLE",
};
const POD_CPU: Desc = Desc {
    name: "pod_cpu_usage_seconds_total",
    help: "Cumulative cpu time consumed by the pod in core-seconds",
    kind: "counter",
    stability: "STABLE",
};
const POD_MEMORY: Desc = Desc {
    name: "pod_memory_working_set_bytes",
    help: "Current working set of the pod in bytes",
    kind: "gauge",
    stability: "STABLE",
};
const CONTAINER_SWAP: Desc = Desc {
    name: "container_swap_usage_bytes",
    help: "Current amount of the container swap usage in bytes. Reported only on non-windows systems",
    kind: "gauge",
    stability: "ALPHA",
};
const POD_SWAP: Desc = Desc {
    name: "pod_swap_usage_bytes",
    help: "Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
    kind: "gauge",
    stability: "ALPHA",
};
const SCRAPE_ERROR: Desc = Desc {
    name: "resource_scrape_error",
    help: "1 if there was an error while getting container metrics, 0 otherwise",
    kind: "gauge",
    stability: "STABLE",
};

/// The exponent from which Go's shortest `%g` switches to exponent form.
const GO_SHORTEST_EXP_LIMIT: i32 = 6;

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)`: the shortest digits, in exponent form when
/// the exponent is below -4 or at least 6 (`ftoa.go`: "if precision was the shortest
/// possible, use precision 6 for this decision"), so 104857600 is `1.048576e+08`.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v == 0.0 {
        return "0".into();
    }
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..GO_SHORTEST_EXP_LIMIT).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    } else {
        format!("{v}")
    }
}

fn ms(rfc3339: &str) -> Option<i64> {
    rfc3339
        .parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// The samples of each family, by family name (sorted as client_golang gathers them).
#[derive(Default)]
struct Families(std::collections::BTreeMap<&'static str, (&'static Desc, Vec<String>)>);

impl Families {
    fn push(&mut self, d: &'static Desc, labels: &[(&str, &str)], value: f64, at: Option<i64>) {
        let mut line = d.name.to_string();
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            line.push_str(&format!("{{{}}}", l.join(",")));
        }
        line.push(' ');
        line.push_str(&go_float(value));
        if let Some(t) = at {
            line.push_str(&format!(" {t}"));
        }
        self.0.entry(d.name).or_insert((d, Vec::new())).1.push(line);
    }
}

fn cpu_seconds(c: &Option<CpuStats>) -> Option<(f64, Option<i64>)> {
    let c = c.as_ref()?;
    Some((c.usage_core_nano_seconds? as f64 / 1e9, ms(&c.time)))
}

fn working_set(m: &Option<MemoryStats>) -> Option<(f64, Option<i64>)> {
    let m = m.as_ref()?;
    Some((m.working_set_bytes? as f64, ms(&m.time)))
}

fn swap(s: &Option<SwapStats>) -> Option<(f64, Option<i64>)> {
    let s = s.as_ref()?;
    Some((s.swap_usage_bytes? as f64, ms(&s.time)))
}

/// The text of `/metrics/resource` for `summary` (`None`: the stats could not be read, only
/// `resource_scrape_error 1`). Families sorted by name, samples by labels, as
/// client_golang's registry gathers them.
pub fn render(summary: Option<&Summary>) -> String {
    let mut f = Families::default();
    match summary {
        None => f.push(&SCRAPE_ERROR, &[], 1.0, None),
        Some(s) => {
            f.push(&SCRAPE_ERROR, &[], 0.0, None);
            if let Some((v, t)) = cpu_seconds(&s.node.cpu) {
                f.push(&NODE_CPU, &[], v, t);
            }
            if let Some((v, t)) = working_set(&s.node.memory) {
                f.push(&NODE_MEMORY, &[], v, t);
            }
            if let Some((v, t)) = swap(&s.node.swap) {
                f.push(&NODE_SWAP, &[], v, t);
            }
            for p in &s.pods {
                pod_samples(p, &mut f);
            }
        }
    }
    let mut out = String::new();
    for (d, mut lines) in f.0.into_values() {
        lines.sort();
        out.push_str(&format!(
            "# HELP {} [{}] {}\n# TYPE {} {}\n",
            d.name, d.stability, d.help, d.name, d.kind
        ));
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// A pod's and its containers' samples (`collectPodCPUMetrics`, `collectContainerStartTime`...).
fn pod_samples(p: &PodStats, f: &mut Families) {
    let pod = [
        ("namespace", p.pod_ref.namespace.as_str()),
        ("pod", p.pod_ref.name.as_str()),
    ];
    for c in &p.containers {
        let labels = [
            ("container", c.name.as_str()),
            ("namespace", p.pod_ref.namespace.as_str()),
            ("pod", p.pod_ref.name.as_str()),
        ];
        if let Some(start) = c
            .start_time
            .parse::<jiff::Timestamp>()
            .ok()
            .filter(|t| t.as_second() > 0)
        {
            let secs = start.as_nanosecond() as f64 / 1e9;
            f.push(
                &CONTAINER_START,
                &labels,
                secs,
                Some(start.as_millisecond()),
            );
        }
        if let Some((v, t)) = cpu_seconds(&c.cpu) {
            f.push(&CONTAINER_CPU, &labels, v, t);
        }
        if let Some((v, t)) = working_set(&c.memory) {
            f.push(&CONTAINER_MEMORY, &labels, v, t);
        }
        if let Some((v, t)) = swap(&c.swap) {
            f.push(&CONTAINER_SWAP, &labels, v, t);
        }
    }
    if let Some((v, t)) = cpu_seconds(&p.cpu) {
        f.push(&POD_CPU, &pod, v, t);
    }
    if let Some((v, t)) = working_set(&p.memory) {
        f.push(&POD_MEMORY, &pod, v, t);
    }
    if let Some((v, t)) = swap(&p.swap) {
        f.push(&POD_SWAP, &pod, v, t);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::super::types::{PodReference, time};
    use super::*;

    #[test]
    fn floats_as_go_formats_them() {
        assert_eq!(go_float(1000.0), "1000");
        assert_eq!(go_float(1.6243962483020916e9), "1.6243962483020916e+09");
        assert_eq!(go_float(10.0), "10");
        assert_eq!(go_float(123_456.0), "123456");
        assert_eq!(go_float(104_857_600.0), "1.048576e+08");
        assert_eq!(go_float(0.5), "0.5");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(0.0), "0");
    }

    #[test]
    fn samples_carry_upstreams_names_labels_and_timestamps() {
        let at = 1_624_396_278_000_000_000u64;
        let mut s = Summary::default();
        s.node.cpu = Some(CpuStats {
            time: time(at),
            usage_core_nano_seconds: Some(10_000_000_000),
            ..CpuStats::default()
        });
        s.pods.push(PodStats {
            pod_ref: PodReference {
                name: "pod_a".into(),
                namespace: "namespace_a".into(),
                uid: "u".into(),
            },
            containers: vec![ContainerStats {
                name: "container_a".into(),
                start_time: time(at - 30_000_000_000),
                memory: Some(MemoryStats {
                    time: time(at),
                    working_set_bytes: Some(1000),
                    ..MemoryStats::default()
                }),
                ..ContainerStats::default()
            }],
            ..PodStats::default()
        });
        let text = render(Some(&s));
        assert!(text.contains(
            "# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes\n\
             # TYPE container_memory_working_set_bytes gauge\n\
             container_memory_working_set_bytes{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278000\n"
        ), "{text}");
        assert!(text.contains(
            "container_start_time_seconds{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.624396248e+09 1624396248000\n"
        ), "{text}");
        assert!(
            text.contains("node_cpu_usage_seconds_total 10 1624396278000\n"),
            "{text}"
        );
        assert!(text.contains("resource_scrape_error 0\n"), "{text}");
        assert!(
            !text.contains("pod_cpu_usage_seconds_total"),
            "no figure, no sample"
        );
        assert_eq!(render(None).lines().last(), Some("resource_scrape_error 1"));
    }
}
