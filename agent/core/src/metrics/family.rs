//! Building metric families by hand, for collectors whose label sets differ from one series to the
//! next (dcgm-exporter adds `pod` only to assigned GPUs), which the fixed-label vectors of the
//! prometheus crate cannot express.

use std::collections::BTreeMap;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// (name, help, type) of one family a hand-built collector can produce.
pub type FamilySpec = (&'static str, &'static str, MetricType);

/// The registry's descriptors for `families`, so it can check names for clashes at registration.
pub fn descs<'a>(
    families: impl IntoIterator<Item = &'a FamilySpec>,
) -> prometheus::Result<Vec<prometheus::core::Desc>> {
    families
        .into_iter()
        .map(|(name, help, _)| {
            prometheus::core::Desc::new(
                name.to_string(),
                help.to_string(),
                Vec::new(),
                Default::default(),
            )
        })
        .collect()
}

/// Label name and value pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// `labels` plus one more.
pub fn with_label(labels: &[(&'static str, String)], name: &'static str, value: &str) -> Labels {
    let mut all = labels.to_vec();
    all.push((name, value.to_string()));
    all
}

/// The samples of one scrape, grouped by family name.
#[derive(Default)]
pub struct Families(BTreeMap<&'static str, Vec<Metric>>);

impl Families {
    pub fn gauge(&mut self, name: &'static str, labels: &[(&'static str, String)], value: f64) {
        let mut gauge = Gauge::default();
        gauge.set_value(value);
        let mut metric = Metric::from_gauge(gauge);
        metric.set_label(label_pairs(labels));
        self.0.entry(name).or_default().push(metric);
    }

    pub fn counter(&mut self, name: &'static str, labels: &[(&'static str, String)], value: f64) {
        let mut counter = Counter::default();
        counter.set_value(value);
        let mut metric = Metric::default();
        metric.set_counter(counter);
        metric.set_label(label_pairs(labels));
        self.0.entry(name).or_default().push(metric);
    }

    /// Passes every sample of every family through `rewrite`: None keeps it, Some its
    /// replacements (none drops it). For a transformation of the series a collector built, as
    /// dcgm-exporter's are transformed after collection.
    pub fn rewrite(
        &mut self,
        mut rewrite: impl FnMut(&'static str, &Metric) -> Option<Vec<Metric>>,
    ) {
        for (name, metrics) in &mut self.0 {
            let mut out = Vec::with_capacity(metrics.len());
            for metric in metrics.drain(..) {
                match rewrite(name, &metric) {
                    None => out.push(metric),
                    Some(replacements) => out.extend(replacements),
                }
            }
            *metrics = out;
        }
    }

    /// The families with samples, with the help and type of `known` (name, help, type); a family
    /// with no sample this scrape is left out, as the registry would prune it anyway.
    pub fn into_families<'a>(
        self,
        known: impl IntoIterator<Item = &'a (&'static str, &'static str, MetricType)>,
    ) -> Vec<MetricFamily> {
        let mut metrics = self.0;
        known
            .into_iter()
            .filter_map(|(name, help, kind)| {
                let samples = metrics.remove(name)?;
                let mut family = MetricFamily::default();
                family.set_name(name.to_string());
                family.set_help(help.to_string());
                family.set_field_type(*kind);
                family.set_metric(samples);
                Some(family)
            })
            .collect()
    }
}

fn label_pairs(labels: &[(&'static str, String)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.clone());
            pair
        })
        .collect()
}

/// The value of label `name` on `metric`.
pub fn label_value<'m>(metric: &'m Metric, name: &str) -> Option<&'m str> {
    metric
        .get_label()
        .iter()
        .find(|pair| pair.name() == name)
        .map(|pair| pair.value())
}

/// `metric` with `extra` labels added and, given `gauge`, that gauge value.
pub fn relabelled(metric: &Metric, extra: &[(&'static str, String)], gauge: Option<f64>) -> Metric {
    let mut copy = metric.clone();
    let mut labels = copy.take_label();
    labels.extend(label_pairs(extra));
    copy.set_label(labels);
    if let Some(value) = gauge {
        let mut gauge = Gauge::default();
        gauge.set_value(value);
        copy.set_gauge(gauge);
    }
    copy
}
