//! Which physical NeuronCores (the driver's `neuron_core<M>` directories) make up each logical
//! NeuronCore, the unit the Neuron runtime, neuron-monitor and the device plugin's
//! `aws.amazon.com/neuroncore` ids count.
//!
//! On Inf1, Inf2 and Trn1 a logical core is one physical core and the numbering is linear
//! (aws-neuron-driver `v2/neuron_dhal_v2.c:1757`: no logical map). On Trn2 each device has 8
//! physical cores (`v3/address_map.h:46-53`) and the runtime groups them by the Logical NeuronCore
//! configuration (LNC, `NEURON_LOGICAL_NC_CONFIG`: 2 by default, 4 logical cores per device; or 1)
//! through the driver's non-linear map `nc_mapping_v0_seng_swap` (`v3/neuron_dhal_v3.c:1810-1827`),
//! with the dies swapped on UltraServer nodes 1 and 3 (`:1831-1874`).

/// The chip family, as the driver writes it in `info/architecture/instance_type`
/// (`v1/neuron_dhal_v1.c:56`, `v2/neuron_dhal_v2.c:100,112`, `v3/neuron_dhal_v3.c:225`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Family {
    Inf1,
    Inf2,
    Trn1,
    Trn2,
    /// A family this agent does not know (a newer chip): numbered linearly, one physical core per
    /// logical core.
    Other(String),
}

impl Family {
    pub fn from_driver(instance_type: &str) -> Family {
        match instance_type {
            "Inf1" => Family::Inf1,
            "Inf2" => Family::Inf2,
            "Trn1" => Family::Trn1,
            "Trn2" => Family::Trn2,
            other => Family::Other(other.to_string()),
        }
    }

    /// The runtime's default LNC: 2 on Trn2, 1 elsewhere (AWS Neuron docs,
    /// `logical-neuroncore-config.rst`: "LNC applies only to Trn2 and Trn3").
    pub fn default_lnc(&self) -> u32 {
        match self {
            Family::Trn2 => 2,
            _ => 1,
        }
    }

    /// Whether the family groups physical cores into logical ones at all.
    pub fn has_lnc(&self) -> bool {
        matches!(self, Family::Trn2)
    }
}

/// One logical NeuronCore of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalCore {
    /// Node-wide index, as the runtime and the device plugin number it.
    pub global: u32,
    /// Physical core indexes within the device (`neuron_core<M>`).
    pub physical: Vec<u32>,
}

/// `nc_mapping_v0_seng_swap`, row = device, entry = the physical core behind each LNC=1 logical
/// core of that device, copied from `v3/neuron_dhal_v3.c:1811-1826`.
const TRN2_NC_MAP: [[u32; 8]; 16] = [
    [4, 5, 6, 7, 2, 3, 0, 1],
    [2, 3, 0, 1, 4, 5, 6, 7],
    [4, 5, 6, 7, 2, 3, 0, 1],
    [2, 3, 0, 1, 4, 5, 6, 7],
    [0, 1, 2, 3, 6, 7, 4, 5],
    [6, 7, 4, 5, 0, 1, 2, 3],
    [0, 1, 2, 3, 6, 7, 4, 5],
    [6, 7, 4, 5, 0, 1, 2, 3],
    [4, 5, 6, 7, 2, 3, 0, 1],
    [2, 3, 0, 1, 4, 5, 6, 7],
    [4, 5, 6, 7, 2, 3, 0, 1],
    [2, 3, 0, 1, 4, 5, 6, 7],
    [0, 1, 2, 3, 6, 7, 4, 5],
    [6, 7, 4, 5, 0, 1, 2, 3],
    [0, 1, 2, 3, 6, 7, 4, 5],
    [6, 7, 4, 5, 0, 1, 2, 3],
];

/// `neuron_nc_map_die_flip_mask` (`v3/neuron_dhal_v3.c:1830`), applied to the map's entry index.
const DIE_FLIP_MASK: usize = 0x6;

/// How this node's cores are grouped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub family: Family,
    /// Physical cores per logical core (1 or 2).
    pub lnc: u32,
    /// UltraServer node 1 or 3 (Trn2 only).
    pub die_flipped: bool,
}

impl Layout {
    /// The logical cores of `device`, given its physical core directories, in logical order.
    /// A physical core the map does not place (a partial device, a device index past the map)
    /// falls back to the linear numbering, so no core is ever dropped.
    pub fn logical_cores(&self, device: u32, physical: &[u32]) -> Vec<LogicalCore> {
        let lnc = self.lnc.max(1) as usize;
        if self.family == Family::Trn2 && physical.len() == 8 {
            if let Some(row) = TRN2_NC_MAP.get(device as usize) {
                let per_device = (8 / lnc) as u32;
                return (0..per_device as usize)
                    .map(|k| LogicalCore {
                        global: device * per_device + k as u32,
                        physical: (0..lnc)
                            .map(|j| {
                                let entry = k * lnc + j;
                                let entry = if self.die_flipped {
                                    entry ^ DIE_FLIP_MASK
                                } else {
                                    entry
                                };
                                row[entry]
                            })
                            .collect(),
                    })
                    .collect();
            }
        }
        let per_device = physical.len() as u32;
        physical
            .iter()
            .enumerate()
            .map(|(i, &p)| LogicalCore {
                global: device * per_device + i as u32,
                physical: vec![p],
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trn2(lnc: u32, die_flipped: bool) -> Layout {
        Layout {
            family: Family::Trn2,
            lnc,
            die_flipped,
        }
    }

    const EIGHT: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

    #[test]
    fn trn2_lnc2_is_four_logical_cores_per_device_on_engine_pairs() {
        let d0 = trn2(2, false).logical_cores(0, &EIGHT);
        assert_eq!(d0.len(), 4);
        // Logical 0 = device 0 / physical 4 and 5 (the map's first two entries).
        assert_eq!(d0[0].physical, [4, 5]);
        assert_eq!(d0[3].physical, [0, 1]);
        let d15 = trn2(2, false).logical_cores(15, &EIGHT);
        assert_eq!(d15[0].global, 60, "64 logical cores on a trn2.48xlarge");
        assert_eq!(d15[3].global, 63);
        assert_eq!(d15[0].physical, [6, 7]);
        // Every physical core belongs to exactly one logical core.
        for device in 0..16 {
            let mut all: Vec<u32> = trn2(2, false)
                .logical_cores(device, &EIGHT)
                .into_iter()
                .flat_map(|c| c.physical)
                .collect();
            all.sort_unstable();
            assert_eq!(all, EIGHT, "device {device}");
        }
    }

    #[test]
    fn trn2_lnc1_follows_the_driver_map_not_the_directory_order() {
        let d1 = trn2(1, false).logical_cores(1, &EIGHT);
        assert_eq!(d1.len(), 8);
        assert_eq!(d1[0].global, 8);
        assert_eq!(d1[0].physical, [2]);
        assert_eq!(d1[7].physical, [7]);
    }

    #[test]
    fn a_die_flipped_ultraserver_node_swaps_the_halves() {
        // Entry index ^ 0x6: logical 0 takes entry 6 (physical 0), logical 1 entry 7 (physical 1).
        let flipped = trn2(1, true).logical_cores(0, &EIGHT);
        assert_eq!(flipped[0].physical, [0]);
        assert_eq!(flipped[1].physical, [1]);
        assert_eq!(flipped[6].physical, [4]);
        let pairs = trn2(2, true).logical_cores(0, &EIGHT);
        assert_eq!(pairs[0].physical, [0, 1]);
        assert_eq!(pairs[3].physical, [4, 5]);
    }

    #[test]
    fn other_families_and_partial_devices_are_linear() {
        let inf2 = Layout {
            family: Family::Inf2,
            lnc: 1,
            die_flipped: false,
        };
        let cores = inf2.logical_cores(11, &[0, 1]);
        assert_eq!(
            cores,
            [
                LogicalCore {
                    global: 22,
                    physical: vec![0]
                },
                LogicalCore {
                    global: 23,
                    physical: vec![1]
                }
            ]
        );
        // A Trn2 device past the driver's 16-row map, or showing fewer than 8 cores.
        assert_eq!(trn2(2, false).logical_cores(16, &EIGHT).len(), 8);
        assert_eq!(trn2(2, false).logical_cores(0, &[0, 1, 2]).len(), 3);
        assert_eq!(Family::from_driver("Trn2").default_lnc(), 2);
        assert_eq!(Family::from_driver("Inf2").default_lnc(), 1);
        assert_eq!(
            Family::from_driver("Trn3"),
            Family::Other("Trn3".into()),
            "an unknown family is kept by name"
        );
    }
}
