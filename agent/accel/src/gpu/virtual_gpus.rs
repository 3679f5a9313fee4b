//! dcgm-exporter's `--kubernetes-virtual-gpus` (`kubelet.virtual_gpus`): a shared device's DCGM_*
//! series copied per replica holder, as its transformation stage copies them after collection
//! (`internal/pkg/transformation/kubernetes.go`). Pure: the collected families and the shared
//! devices in, the families rewritten.

use mlnode_core::metrics::family::{label_value, relabelled, Families, Labels};

/// A shared device under `kubelet.virtual_gpus`: where its DCGM_* series are (the parent GPU's
/// `UUID`, and `GPU_I_ID` for a MIG device), and the copy each holder gets.
pub struct SharedDevice {
    pub uuid: String,
    pub gpu_instance: Option<String>,
    pub copies: Vec<HolderCopy>,
}

pub struct HolderCopy {
    /// The holder's names, what `holder_labels` adds, and `vgpu`.
    pub labels: Labels,
    /// Its own framebuffer MiB and SM percent, where the device's processes were read.
    pub own: Option<(f64, f64)>,
}

/// The families dcgm-exporter's per-process collection gives each holder its own value of
/// (its PR #594); the device-level sample stays beside them.
const PER_PROCESS_FAMILIES: [&str; 2] = ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"];

/// dcgm-exporter's `--kubernetes-virtual-gpus` transformation of the DCGM_* series of `shared`
/// devices: each sample becomes one copy per holder; framebuffer used and GPU utilisation keep
/// the device's sample and give each copy the holder's own use, where that was read.
pub fn copy_per_holder(out: &mut Families, shared: &[SharedDevice]) {
    if shared.is_empty() {
        return;
    }
    out.rewrite(|name, metric| {
        if !name.starts_with("DCGM_") {
            return None;
        }
        let device = shared.iter().find(|d| {
            label_value(metric, "UUID") == Some(d.uuid.as_str())
                && label_value(metric, "GPU_I_ID") == d.gpu_instance.as_deref()
        })?;
        let per_process = PER_PROCESS_FAMILIES.contains(&name);
        let mut samples = Vec::new();
        if per_process && device.copies.iter().any(|c| c.own.is_some()) {
            samples.push(metric.clone());
        }
        for copy in &device.copies {
            let own = copy.own.filter(|_| per_process).map(|(mib, percent)| {
                if name == "DCGM_FI_DEV_FB_USED" {
                    mib
                } else {
                    percent
                }
            });
            samples.push(relabelled(metric, &copy.labels, own));
        }
        Some(samples)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::proto::MetricType;

    fn device(uuid: &str) -> Labels {
        vec![("gpu", "0".into()), ("UUID", uuid.into())]
    }

    fn holder(pod: &str, vgpu: &str, own: Option<(f64, f64)>) -> HolderCopy {
        HolderCopy {
            labels: vec![("pod", pod.into()), ("vgpu", vgpu.into())],
            own,
        }
    }

    fn samples(out: Families, family: &'static str) -> Vec<(Vec<(String, String)>, f64)> {
        let known = [(family, "", MetricType::GAUGE)];
        out.into_families(known.iter())
            .into_iter()
            .flat_map(|f| f.get_metric().to_vec())
            .map(|m| {
                let labels = m
                    .get_label()
                    .iter()
                    .map(|p| (p.name().to_string(), p.value().to_string()))
                    .collect();
                (labels, m.get_gauge().get_value())
            })
            .collect()
    }

    #[test]
    fn each_holder_gets_a_copy_and_its_own_use_beside_the_devices() {
        let build = || {
            let mut out = Families::default();
            out.gauge("DCGM_FI_DEV_GPU_TEMP", &device("GPU-1"), 61.0);
            out.gauge("DCGM_FI_DEV_FB_USED", &device("GPU-1"), 3000.0);
            out.gauge("DCGM_FI_DEV_GPU_TEMP", &device("GPU-2"), 55.0);
            out.gauge("mlnode_gpu_temperature_celsius", &device("GPU-1"), 61.0);
            out
        };
        let shared = [SharedDevice {
            uuid: "GPU-1".into(),
            gpu_instance: None,
            copies: vec![
                holder("a", "0", Some((1000.0, 30.0))),
                holder("b", "1", Some((0.0, 0.0))),
            ],
        }];
        let mut out = build();
        copy_per_holder(&mut out, &shared);
        let temps = samples(out, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(
            temps.len(),
            3,
            "two copies of GPU-1's, GPU-2's as it was: {temps:?}"
        );
        assert!(temps
            .iter()
            .filter(|(l, _)| l.iter().any(|(n, v)| n == "UUID" && v == "GPU-1"))
            .all(|(l, v)| *v == 61.0 && l.iter().any(|(n, _)| n == "vgpu")));
        let mut out = build();
        copy_per_holder(&mut out, &shared);
        let used = samples(out, "DCGM_FI_DEV_FB_USED");
        let values: Vec<f64> = used.iter().map(|(_, v)| *v).collect();
        assert_eq!(
            values,
            [3000.0, 1000.0, 0.0],
            "the device's, then each holder's own"
        );
        let mut out = build();
        copy_per_holder(&mut out, &shared);
        assert_eq!(
            samples(out, "mlnode_gpu_temperature_celsius").len(),
            1,
            "only DCGM_* are copied"
        );
    }

    #[test]
    fn without_per_process_readings_every_copy_repeats_the_device() {
        let mut out = Families::default();
        out.gauge("DCGM_FI_DEV_FB_USED", &device("GPU-1"), 3000.0);
        copy_per_holder(
            &mut out,
            &[SharedDevice {
                uuid: "GPU-1".into(),
                gpu_instance: None,
                copies: vec![holder("a", "0", None), holder("b", "1", None)],
            }],
        );
        let used = samples(out, "DCGM_FI_DEV_FB_USED");
        assert_eq!(
            used.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            [3000.0, 3000.0]
        );
    }
}
