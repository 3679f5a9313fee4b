//! Kernel log lines as the drivers print them, parsed into facts. A line of any other form is
//! ignored, never half-read: each form is matched whole up to its number, and a number that does
//! not parse drops the line.
//!
//! Formats, from the drivers' source (cited in docs/kernel-log.md): NVIDIA's open-gpu-kernel-modules
//! at df1c9a3 (595.45.04) and aws-neuron-driver at fca19f7 (2.24.7.0):
//! - NVIDIA/open-gpu-kernel-modules `src/nvidia/src/kernel/gpu/rc/kernel_rc.c:380-416`:
//!   `NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <msg>`, or without the process
//!   `NVRM: Xid (PCI:%04x:%02x:%02x): %d, <msg>`; under MIG the address is followed by
//!   ` GPU-I:%02u` and possibly ` GPU-CI:%02u`.
//! - `src/nvidia/arch/nvalloc/unix/src/osinit.c:368,374`: at runtime
//!   `NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus.`;
//!   `kernel-open/nvidia/osapi.c:3657-3661`: at probe time three lines,
//!   `NVRM: The NVIDIA GPU %04x:%02x:%02x.%x`, `NVRM: (PCI ID: %04x:%04x) installed in this system has`,
//!   `NVRM: fallen off the bus and is not responding to commands.`
//! - `src/common/nvswitch/kernel/inc/common_nvswitch.h:163,176`:
//!   `nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, <fmt>`.
//! - aws-neuron/aws-neuron-driver `neuron_cdev.c:2003-2024` (`NEURON_IOCTL_PRINTK`: the runtime's
//!   line printed at KERN_ERR) and aws-neuron-sdk `neuron-runtime/nrt-troubleshoot.rst:479`:
//!   `NEURON_HW_ERR=<CLASS> instance-id=... hostname=... nd-id=<n> nc-id=<n> serial-num=... action=<ACTION>`.

use std::fmt;

/// A PCI address as the drivers print it; the XID line has no function (`PCI:0000:5a:00`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: Option<u8>,
}

impl PciAddress {
    /// `0000:5a:00` or `0000:5a:00.0`, hexadecimal.
    fn parse(text: &str) -> Option<PciAddress> {
        let (domain, rest) = text.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = match rest.split_once('.') {
            Some((device, function)) => (device, Some(function)),
            None => (rest, None),
        };
        let hex = |s: &str, max: usize| {
            (!s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        Some(PciAddress {
            domain: hex(domain, 8)?,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: u8::try_from(hex(device, 2)?).ok()?,
            function: match function {
                Some(f) => Some(u8::try_from(hex(f, 1)?).ok()?),
                None => None,
            },
        })
    }

    /// The same slot, whatever the function: the XID line names none, NVML always `.0`.
    pub fn same_slot(&self, other: &PciAddress) -> bool {
        (self.domain, self.bus, self.device) == (other.domain, other.bus, other.device)
    }

    /// The slot as NVML writes a GPU's bus id (`00000000:5A:00.0`), to join with its series.
    pub fn nvml_bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// From NVML's bus id, `00000000:5A:00.0`.
    pub fn from_nvml(bus_id: &str) -> Option<PciAddress> {
        PciAddress::parse(&bus_id.to_ascii_lowercase())
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )?;
        match self.function {
            Some(function) => write!(f, ".{function:x}"),
            None => Ok(()),
        }
    }
}

/// What one kernel log line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvent {
    Xid {
        gpu: PciAddress,
        xid: u64,
        /// The process the driver names, when it names one.
        pid: Option<u32>,
        process: Option<String>,
        /// The rest of the line: the driver's words for this XID.
        detail: String,
    },
    /// The GPU no longer answers on the bus (at runtime, or already at probe time).
    FallenOffBus { gpu: PciAddress },
    Sxid {
        /// The NVSwitch's address.
        switch: PciAddress,
        sxid: u32,
        detail: String,
    },
    NeuronHardwareError {
        /// `SRAM_UNCORRECTABLE_ERROR`, `NC_UNCORRECTABLE_ERROR`, `HBM_UNCORRECTABLE_ERROR`,
        /// `DMA_ERROR`, or a class newer than this agent knows.
        class: String,
        device: Option<u32>,
        core: Option<u32>,
        action: Option<String>,
    },
}

/// The parser keeps the one thing a line cannot say alone: the GPU the probe-time fallen-off-bus
/// message names two lines before it says so.
#[derive(Debug, Default)]
pub struct Parser {
    probing: Option<PciAddress>,
}

impl Parser {
    /// A journal entry's `MESSAGE`, as stored: most kernel lines are no driver's, and are passed
    /// over on a test of their bytes, without decoding them.
    pub fn message(&mut self, message: &[u8]) -> Option<KernelEvent> {
        let maybe_driver = message.starts_with(b"NVRM: ")
            || message.starts_with(b"nvidia-")
            || memchr::memmem::find(message, NEURON_TOKEN.as_bytes()).is_some();
        if !maybe_driver {
            return None;
        }
        self.line(&String::from_utf8_lossy(message))
    }

    pub fn line(&mut self, message: &str) -> Option<KernelEvent> {
        let message = message.trim_end();
        if let Some(rest) = message.strip_prefix("NVRM: ") {
            return self.nvrm(rest);
        }
        if let Some(event) = sxid(message) {
            return Some(event);
        }
        neuron(message)
    }

    fn nvrm(&mut self, rest: &str) -> Option<KernelEvent> {
        if let Some(xid_line) = rest.strip_prefix("Xid (PCI:") {
            return xid(xid_line);
        }
        if let Some(gpu) = rest
            .strip_prefix("GPU ")
            .and_then(|r| r.strip_suffix(": GPU has fallen off the bus."))
        {
            return Some(KernelEvent::FallenOffBus {
                gpu: PciAddress::parse(gpu)?,
            });
        }
        if let Some(gpu) = rest.strip_prefix("The NVIDIA GPU ") {
            self.probing = PciAddress::parse(gpu.split_whitespace().next()?);
            return None;
        }
        if rest == "fallen off the bus and is not responding to commands." {
            return self
                .probing
                .take()
                .map(|gpu| KernelEvent::FallenOffBus { gpu });
        }
        None
    }
}

/// After `NVRM: Xid (PCI:`: `0000:5a:00[ GPU-I:01[ GPU-CI:00]]): 79, [pid=..., name=..., ]msg`.
fn xid(line: &str) -> Option<KernelEvent> {
    let (attr, rest) = line.split_once("): ")?;
    let address = attr.split(' ').next()?;
    let gpu = PciAddress::parse(address).filter(|a| a.function.is_none())?;
    let (number, rest) = rest.split_once(',').unwrap_or((rest, ""));
    let xid: u64 = number.trim().parse().ok()?;
    let mut detail = rest.trim_start();
    let (mut pid, mut process) = (None, None);
    if let Some(after) = detail.strip_prefix("pid=") {
        let (value, tail) = after.split_once(", ").unwrap_or((after, ""));
        pid = value.parse().ok();
        detail = tail;
        if let Some(after) = detail.strip_prefix("name=") {
            let (value, tail) = after.split_once(", ").unwrap_or((after, ""));
            process = Some(value.to_string());
            detail = tail;
        }
    }
    Some(KernelEvent::Xid {
        gpu,
        xid,
        pid,
        process,
        detail: detail.to_string(),
    })
}

/// `nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 12028, <fmt>`.
fn sxid(message: &str) -> Option<KernelEvent> {
    let rest = message.strip_prefix("nvidia-")?;
    let (_, rest) = rest.split_once(": SXid (PCI:")?;
    let (address, rest) = rest.split_once("): ")?;
    let switch = PciAddress::parse(address)?;
    let (number, detail) = rest.split_once(',').unwrap_or((rest, ""));
    Some(KernelEvent::Sxid {
        switch,
        sxid: number.trim().parse().ok()?,
        detail: detail.trim().to_string(),
    })
}

const NEURON_TOKEN: &str = "NEURON_HW_ERR=";

/// `... NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR ... nd-id=0 nc-id=0 ... action=TERMINATE_INSTANCE`,
/// the token anywhere in the line (node-problem-detector's rules match it after a prefix).
fn neuron(message: &str) -> Option<KernelEvent> {
    if !message.contains(NEURON_TOKEN) {
        return None;
    }
    let words: Vec<&str> = message.split_whitespace().collect();
    let value = |key: &str| {
        words
            .iter()
            .find_map(|w| w.strip_prefix(key))
            .filter(|v| !v.is_empty())
    };
    let class = value(NEURON_TOKEN)?;
    if !class.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
        return None;
    }
    Some(KernelEvent::NeuronHardwareError {
        class: class.to_string(),
        device: value("nd-id=").and_then(|v| v.parse().ok()),
        core: value("nc-id=").and_then(|v| v.parse().ok()),
        action: value("action=").map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(lines: &[&str]) -> Vec<KernelEvent> {
        let mut parser = Parser::default();
        lines.iter().filter_map(|l| parser.line(l)).collect()
    }

    fn pci(text: &str) -> PciAddress {
        PciAddress::parse(text).unwrap()
    }

    /// The catalog's own examples (docs.nvidia.com/deploy/xid-errors, "XID 79", "XID 13") and
    /// kernel_rc.c's two forms, with and without the process, and under MIG.
    #[test]
    fn a_stored_message_is_read_as_its_line_and_others_passed_over_undecoded() {
        let mut parser = Parser::default();
        for line in [
            "NVRM: Xid (PCI:0000:5a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal",
            "[ 12.3] neuron: NEURON_HW_ERR=DMA_ERROR nd-id=1 action=RESTART",
        ] {
            assert_eq!(
                parser.message(line.as_bytes()),
                Parser::default().line(line),
                "{line}"
            );
            assert!(parser.message(line.as_bytes()).is_some(), "{line}");
        }
        assert_eq!(parser.message(b"nvme nvme0: I/O tag 17 timeout"), None);
        // A driver line with a byte that is not UTF-8 (a process name) is still read.
        let bytes = b"NVRM: Xid (PCI:0000:5a:00): 13, pid=9, name=py\xfft, detail";
        assert!(matches!(
            parser.message(bytes),
            Some(KernelEvent::Xid { xid: 13, .. })
        ));
    }

    #[test]
    fn xid_lines_in_each_form_the_driver_prints() {
        let events = parse(&[
            "NVRM: Xid (PCI:0000:5a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            "NVRM: Xid (PCI:0000:0b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
            "NVRM: Xid (PCI:0000:1a:00 GPU-I:02 GPU-CI:00): 31, pid=4321, name=vllm, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2e_3c000000.",
            "NVRM: Xid (PCI:0000:5a:00): 45, pid='<unknown>', name=<unknown>, Ch 00000010 caused by previous Xid 79",
        ]);
        assert_eq!(
            events[0],
            KernelEvent::Xid {
                gpu: pci("0000:5a:00"),
                xid: 79,
                pid: Some(1234),
                process: Some("python3".into()),
                detail: "GPU has fallen off the bus.".into()
            }
        );
        let KernelEvent::Xid {
            gpu,
            xid,
            pid,
            process,
            detail,
        } = &events[1]
        else {
            panic!()
        };
        assert_eq!(
            (gpu.bus, *xid, *pid, process.as_deref()),
            (0x0b, 13, None, None)
        );
        assert!(detail.starts_with("Graphics SM Warp Exception"));
        let KernelEvent::Xid {
            gpu, xid, process, ..
        } = &events[2]
        else {
            panic!()
        };
        assert_eq!(
            (gpu.bus, *xid, process.as_deref()),
            (0x1a, 31, Some("vllm")),
            "a MIG instance's XID is its GPU's"
        );
        let KernelEvent::Xid { xid, pid, .. } = &events[3] else {
            panic!()
        };
        assert_eq!((*xid, *pid), (45, None), "an unknown pid is no pid");
    }

    #[test]
    fn fallen_off_the_bus_at_runtime_and_at_probe() {
        assert_eq!(
            parse(&[
                "NVRM: GPU 0000:5a:00.0: GPU has fallen off the bus.",
                "NVRM: GPU 0000:5a:00.0: GPU serial number is 1654922000123.",
            ]),
            [KernelEvent::FallenOffBus {
                gpu: pci("0000:5a:00.0")
            }]
        );
        assert_eq!(
            parse(&[
                "NVRM: The NVIDIA GPU 0000:bd:00.0",
                "NVRM: (PCI ID: 10de:2330) installed in this system has",
                "NVRM: fallen off the bus and is not responding to commands.",
            ]),
            [KernelEvent::FallenOffBus {
                gpu: pci("0000:bd:00.0")
            }]
        );
        assert!(
            parse(&[
                "NVRM: The NVIDIA GPU 0000:bd:00.0 (PCI ID: 10de:2330)",
                "NVRM: installed in this system is not supported by the",
                "NVRM: NVIDIA 580.95.05 driver release.",
            ])
            .is_empty(),
            "another probe message naming a GPU is not a fall"
        );
        assert!(
            parse(&["NVRM: fallen off the bus and is not responding to commands."]).is_empty(),
            "no GPU named"
        );
    }

    #[test]
    fn sxid_lines_name_the_switch_and_the_number() {
        assert_eq!(
            parse(&["nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"]),
            [KernelEvent::Sxid {
                switch: pci("0000:c5:00.0"),
                sxid: 12028,
                detail: "Non-fatal, Link 32 egress non-posted PRIV error (First)".into()
            }]
        );
        assert_eq!(
            parse(&["nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 00024, Fatal, Link 04 TSTATE ..."]),
            [KernelEvent::Sxid {
                switch: pci("0000:05:00.0"),
                sxid: 24,
                detail: "Fatal, Link 04 TSTATE ...".into()
            }],
            "%05d: leading zeros"
        );
    }

    /// The line nrt-troubleshoot.rst documents, behind the prefix the runtime's printk carries.
    #[test]
    fn neuron_hardware_errors_with_their_device() {
        assert_eq!(
            parse(&["nrt: NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0123456789abcdef0 hostname=ip-10-0-1-23 nd-id=3 nc-id=1 serial-num=0x1a2b3c4d action=TERMINATE_INSTANCE"]),
            [KernelEvent::NeuronHardwareError {
                class: "SRAM_UNCORRECTABLE_ERROR".into(),
                device: Some(3),
                core: Some(1),
                action: Some("TERMINATE_INSTANCE".into())
            }]
        );
        let [KernelEvent::NeuronHardwareError { class, device, .. }] =
            &parse(&["NEURON_HW_ERR=DMA_ERROR nd-id=0"])[..]
        else {
            panic!()
        };
        assert_eq!((class.as_str(), *device), ("DMA_ERROR", Some(0)));
    }

    /// Near misses of every form: ignored, never read as something else.
    #[test]
    fn lines_of_another_form_are_ignored() {
        let noise = [
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05",
            "NVRM: Xid (PCI:0000:5a:00): seventy-nine, GPU has fallen off the bus.",
            "NVRM: Xid (PCI:0000:5a:00.0): 79, a function where the driver prints none",
            "NVRM: Xid (PCI:zz:5a:00): 79, bad domain",
            "NVRM: Xid (PCI:0000:5a:00) 79, no colon",
            "NVRM: GPU 0000:5a:00.0: GPU serial number is 1654922000123.",
            "nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): x, bad number",
            "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
            "audit: NVRM: Xid (PCI:0000:5a:00): 79, quoted by another subsystem",
            "NEURON_HW_ERR= nd-id=0",
            "NEURON_HW_ERR=sram_lowercase nd-id=0",
            "neuron: probe of 0000:00:1e.0 done",
            &"x".repeat(64 * 1024),
            "",
        ];
        assert_eq!(parse(&noise), []);
    }

    #[test]
    fn nvml_bus_ids_meet_the_drivers_addresses_by_slot() {
        let nvml = PciAddress::from_nvml("00000000:5A:00.0").unwrap();
        assert!(nvml.same_slot(&pci("0000:5a:00")));
        assert!(!nvml.same_slot(&pci("0000:5b:00")));
        assert_eq!(nvml.to_string(), "0000:5a:00.0");
    }
}
