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
