//! The classic Prometheus text format (0.0.4), for scrapers that do not ask
//! for OpenMetrics (curl, promtool, older Prometheus): prometheus-client
//! writes OpenMetrics only.

/// The same samples as `openmetrics`: a counter's HELP and TYPE name its
/// `_total` series, and the UNIT and EOF lines go.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(h) = line.strip_prefix("# HELP ") {
            help = Some(h);
            continue;
        }
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|t| t.rsplit_once(' ')) {
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), kind),
                "unknown" => (name.to_string(), "untyped"),
                _ => (name.to_string(), kind),
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(&format!("# HELP {h}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_format_names_counters_by_their_total_series() {
        let om =
            "# HELP x_calls Calls.\n# TYPE x_calls counter\nx_calls_total 3\n# HELP y Y.\n# TYPE y gauge\n# UNIT y bytes\ny 1\n# EOF\n";
        assert_eq!(
            super::to_text_format(om),
            "# HELP x_calls_total Calls.\n# TYPE x_calls_total counter\nx_calls_total 3\n# HELP y Y.\n# TYPE y gauge\ny 1\n"
        );
    }
}
