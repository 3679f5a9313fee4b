// nvidia-mocks turns NVIDIA's own hardware mocks into what the agent's tests run on, so the values
// the agent is checked against come from NVIDIA's descriptions of its hardware, not from this
// repository:
//
//	nvidia-mocks nvml --server dgxh100 [--mig]
//	    walks go-nvml's mock server (pkg/nvml/mock: dgxa100, dgxh100, dgxh200, dgxb200) through
//	    go-nvml's nvml.Interface and prints {"scenario": ..., "answers": ...}: the scenario in
//	    tests/fake-nvml's format, and what the mock answered, call by call, for the test to compare
//	    the agent's series with. With --mig, GPU 0 is split into seven 1-slice instances and GPU 1
//	    into a mixed split, through the mock's own CreateGpuInstanceWithPlacement and
//	    CreateComputeInstance at NVIDIA's placements; the profile names are go-nvlib's.
//	nvidia-mocks pci --a100 ADDR[,ADDR...] [--vfs ADDR=N]... [--vfio ADDR]...
//	    writes go-nvlib's MockNvpci tree (pkg/nvpci, AddMockA100 with SR-IOV virtual functions)
//	    under $TMPDIR, binds the --vfio functions to vfio-pci, and prints {"root": ..., "gpus":
//	    [...], "all": [...]}: nvpci's own reading of the tree (GetGPUs, GetAllDevices).
//
// A call the mock leaves unmodelled panics in go-nvml's generated mock ("method is nil"); the C
// library answers such a call NVML_ERROR_NOT_SUPPORTED, and so does the scenario. A call the mock
// starts to model fails this program, naming it, so a newer go-nvml is carried over rather than
// silently left out.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: nvidia-mocks nvml|pci [flags]")
	}
	var out any
	var err error
	switch os.Args[1] {
	case "nvml":
		out, err = nvmlCommand(os.Args[2:])
	case "pci":
		out, err = pciCommand(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: nvml or pci", os.Args[1])
	}
	if err != nil {
		fail(err.Error())
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", " ")
	if err := encoder.Encode(out); err != nil {
		fail(err.Error())
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "nvidia-mocks:", message)
	os.Exit(1)
}

var servers = map[string]func() *server.Server{
	"dgxa100": dgxa100.New,
	"dgxh100": dgxh100.New,
	"dgxh200": dgxh200.New,
	"dgxb200": dgxb200.New,
}

// Answers is what the mock said, in go-nvml's terms.
type Answers struct {
	DriverVersion     string      `json:"driver_version"`
	NvmlVersion       string      `json:"nvml_version"`
	CudaDriverVersion int         `json:"cuda_driver_version"`
	Gpus              []GpuAnswer `json:"gpus"`
}

type GpuAnswer struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// The bus id as the mock's device holds it and DeviceGetHandleByPciBusId finds it
	// (`0000:07:00.0`, nvml.h's legacy form).
	PciBusID     string   `json:"pci_bus_id"`
	PciDeviceID  uint32   `json:"pci_device_id"`
	MemoryTotal  uint64   `json:"memory_total"`
	MemoryUsed   uint64   `json:"memory_used"`
	MemoryFree   uint64   `json:"memory_free"`
	Minor        int      `json:"minor_number"`
	CudaMajor    int      `json:"cuda_major"`
	CudaMinor    int      `json:"cuda_minor"`
	Architecture uint32   `json:"architecture"`
	MigMode      int      `json:"mig_mode"`
	MigDevices   []Mig    `json:"mig_devices"`
	NotModelled  []string `json:"not_modelled"`
}

// Mig is one MIG device: a compute instance within a GPU instance.
type Mig struct {
	UUID              string `json:"uuid"`
	Profile           string `json:"profile"`
	GpuInstanceID     uint32 `json:"gpu_instance_id"`
	ComputeInstanceID uint32 `json:"compute_instance_id"`
	GpuInstanceSlices uint32 `json:"gpu_instance_slices"`
	ComputeSlices     uint32 `json:"compute_instance_slices"`
	PlacementStart    uint32 `json:"placement_start"`
	MemoryBytes       uint64 `json:"memory_bytes"`
}

func nvmlCommand(args []string) (any, error) {
	flags := flag.NewFlagSet("nvml", flag.ContinueOnError)
	name := flags.String("server", "", "dgxa100, dgxh100, dgxh200 or dgxb200")
	mig := flags.Bool("mig", false, "split GPU 0 into seven 1-slice instances and GPU 1 into a mixed split")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	build, ok := servers[*name]
	if !ok {
		return nil, fmt.Errorf("--server %q: one of dgxa100, dgxh100, dgxh200, dgxb200", *name)
	}
	srv := build()
	var lib nvml.Interface = srv
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("Init: %v", ret)
	}
	answers := Answers{}
	var ret nvml.Return
	if answers.DriverVersion, ret = lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("SystemGetDriverVersion: %v", ret)
	}
	if answers.NvmlVersion, ret = lib.SystemGetNVMLVersion(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("SystemGetNVMLVersion: %v", ret)
	}
	if answers.CudaDriverVersion, ret = lib.SystemGetCudaDriverVersion(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("SystemGetCudaDriverVersion: %v", ret)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("DeviceGetCount: %v", ret)
	}
	names := device.New(lib)
	var devices []map[string]any
	for i := 0; i < count; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("DeviceGetHandleByIndex(%d): %v", i, ret)
		}
		gpu, err := readGpu(lib, i, d)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		if *mig && i < 2 {
			split := fullSplit
			if i == 1 {
				split = mixedSplit
			}
			if gpu.MigDevices, err = migSplit(d, names, gpu.MemoryTotal, split); err != nil {
				return nil, fmt.Errorf("GPU %d's MIG split: %w", i, err)
			}
			if gpu.MigMode, _, ret = d.GetMigMode(); ret != nvml.SUCCESS {
				return nil, fmt.Errorf("GPU %d: GetMigMode: %v", i, ret)
			}
		}
		answers.Gpus = append(answers.Gpus, gpu)
		devices = append(devices, scenarioDevice(gpu))
	}
	scenario := map[string]any{
		"driver_version":      answers.DriverVersion,
		"cuda_driver_version": answers.CudaDriverVersion,
		"devices":             devices,
	}
	return map[string]any{"scenario": scenario, "answers": answers}, nil
}

func readGpu(lib nvml.Interface, index int, d nvml.Device) (GpuAnswer, error) {
	gpu := GpuAnswer{Index: index}
	var ret nvml.Return
	failed := func(call string) error { return fmt.Errorf("%s: %v", call, ret) }
	if gpu.Name, ret = d.GetName(); ret != nvml.SUCCESS {
		return gpu, failed("GetName")
	}
	if gpu.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return gpu, failed("GetUUID")
	}
	if gpu.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return gpu, failed("GetMinorNumber")
	}
	if gpu.CudaMajor, gpu.CudaMinor, ret = d.GetCudaComputeCapability(); ret != nvml.SUCCESS {
		return gpu, failed("GetCudaComputeCapability")
	}
	var arch nvml.DeviceArchitecture
	if arch, ret = d.GetArchitecture(); ret != nvml.SUCCESS {
		return gpu, failed("GetArchitecture")
	}
	gpu.Architecture = uint32(arch)
	var memory nvml.Memory
	if memory, ret = d.GetMemoryInfo(); ret != nvml.SUCCESS {
		return gpu, failed("GetMemoryInfo")
	}
	gpu.MemoryTotal, gpu.MemoryUsed, gpu.MemoryFree = memory.Total, memory.Used, memory.Free
	var pci nvml.PciInfo
	if pci, ret = d.GetPciInfo(); ret != nvml.SUCCESS {
		return gpu, failed("GetPciInfo")
	}
	gpu.PciDeviceID = pci.PciDeviceId
	// The mock's GetPciInfo fills in the device id alone; its bus id is the one its
	// DeviceGetHandleByPciBusId resolves, checked here to be this GPU's.
	gpu.PciBusID = d.(*server.Device).PciBusID
	if found, ret := lib.DeviceGetHandleByPciBusId(gpu.PciBusID); ret != nvml.SUCCESS || found != d {
		return gpu, fmt.Errorf("DeviceGetHandleByPciBusId(%s) does not find the GPU: %v", gpu.PciBusID, ret)
	}
	for _, call := range telemetry {
		if modelled(func() { call.ask(d) }) {
			return gpu, fmt.Errorf("go-nvml's mock now models %s: carry its answer into the scenario (%s)", call.nvml, call.field)
		}
		gpu.NotModelled = append(gpu.NotModelled, call.field)
	}
	return gpu, nil
}

// telemetry is each reading the agent takes, by tests/fake-nvml's name for it, and the go-nvml call
// that answers it.
var telemetry = []struct {
	field string
	nvml  string
	ask   func(nvml.Device)
}{
	{"reserved", "GetMemoryInfo_v2", func(d nvml.Device) { d.GetMemoryInfo_v2() }},
	{"temperature", "GetTemperature", func(d nvml.Device) { d.GetTemperature(nvml.TEMPERATURE_GPU) }},
	{"temperature_v", "GetTemperatureV", func(d nvml.Device) { d.GetTemperatureV() }},
	{"power", "GetPowerUsage", func(d nvml.Device) { d.GetPowerUsage() }},
	{"utilization", "GetUtilizationRates", func(d nvml.Device) { d.GetUtilizationRates() }},
	{"sm_clock", "GetClockInfo", func(d nvml.Device) { d.GetClockInfo(nvml.CLOCK_SM) }},
	{"mem_clock", "GetClockInfo", func(d nvml.Device) { d.GetClockInfo(nvml.CLOCK_MEM) }},
	{"energy", "GetTotalEnergyConsumption", func(d nvml.Device) { d.GetTotalEnergyConsumption() }},
	{"clocks_event_reasons", "GetCurrentClocksEventReasons", func(d nvml.Device) { d.GetCurrentClocksEventReasons() }},
	{"throttle_reasons", "GetCurrentClocksThrottleReasons", func(d nvml.Device) { d.GetCurrentClocksThrottleReasons() }},
	{"encoder", "GetEncoderUtilization", func(d nvml.Device) { d.GetEncoderUtilization() }},
	{"decoder", "GetDecoderUtilization", func(d nvml.Device) { d.GetDecoderUtilization() }},
	{"pcie_replay", "GetPcieReplayCounter", func(d nvml.Device) { d.GetPcieReplayCounter() }},
	{"pcie_throughput", "GetPcieThroughput", func(d nvml.Device) { d.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES) }},
	{"remapped_rows", "GetRemappedRows", func(d nvml.Device) { d.GetRemappedRows() }},
	{"field_values", "GetFieldValues", func(d nvml.Device) { d.GetFieldValues(nil) }},
	{"nvlink", "GetNvLinkState", func(d nvml.Device) { d.GetNvLinkState(0) }},
	{"gpm", "GpmQueryDeviceSupport", func(d nvml.Device) { d.GpmQueryDeviceSupport() }},
	{"fabric", "GetGpuFabricInfo", func(d nvml.Device) { d.GetGpuFabricInfo() }},
	{"processes", "GetComputeRunningProcesses", func(d nvml.Device) { d.GetComputeRunningProcesses() }},
	{"process_utilization", "GetProcessUtilization", func(d nvml.Device) { d.GetProcessUtilization(0) }},
	{"register_events", "RegisterEvents", func(d nvml.Device) { d.RegisterEvents(0, nil) }},
}

// modelled is whether the mock answers the call rather than panicking as go-nvml's generated mock
// does for a method it was given no function for.
func modelled(call func()) (answered bool) {
	defer func() {
		if recover() != nil {
			answered = false
		}
	}()
	call()
	return true
}

// A split is GPU instance profiles, each with the compute instance profiles to create in it.
type split []struct {
	gpuInstance      int
	computeInstances []int
}

// Seven 1-slice GPU instances, each one compute instance: the whole GPU in 1g devices.
var fullSplit = split{
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
}

// A 3-slice GPU instance shared by a 1-slice and a 2-slice compute instance, a 2-slice one, and two
// 1-slice ones: seven slices, five MIG devices, the `<c>c.<g>g` names included.
var mixedSplit = split{
	{nvml.GPU_INSTANCE_PROFILE_3_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_2_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}},
}

// migSplit enables MIG and creates the split's instances through the mock, each GPU instance at the
// first of NVIDIA's possible placements that no earlier one overlaps.
func migSplit(d nvml.Device, names device.Interface, memoryTotal uint64, s split) ([]Mig, error) {
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("SetMigMode: %v", ret)
	}
	var used []nvml.GpuInstancePlacement
	var migs []Mig
	for _, want := range s {
		profile, ret := d.GetGpuInstanceProfileInfo(want.gpuInstance)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GetGpuInstanceProfileInfo(%d): %v", want.gpuInstance, ret)
		}
		placements, ret := d.GetGpuInstancePossiblePlacements(&profile)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GetGpuInstancePossiblePlacements(%d): %v", want.gpuInstance, ret)
		}
		placement, ok := firstFree(placements, used)
		if !ok {
			return nil, fmt.Errorf("no free placement for GPU instance profile %d among %v (used %v)", want.gpuInstance, placements, used)
		}
		used = append(used, placement)
		gi, ret := d.CreateGpuInstanceWithPlacement(&profile, &placement)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("CreateGpuInstanceWithPlacement: %v", ret)
		}
		giInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GpuInstance.GetInfo: %v", ret)
		}
		for _, ciProfileID := range want.computeInstances {
			ciProfile, ret := gi.GetComputeInstanceProfileInfo(ciProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("GetComputeInstanceProfileInfo(%d) in a %d-slice instance: %v", ciProfileID, profile.SliceCount, ret)
			}
			ci, ret := gi.CreateComputeInstance(&ciProfile)
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("CreateComputeInstance: %v", ret)
			}
			ciInfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("ComputeInstance.GetInfo: %v", ret)
			}
			name, err := names.NewMigProfile(int(giInfo.ProfileId), int(ciInfo.ProfileId), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, profile.MemorySizeMB, memoryTotal)
			if err != nil {
				return nil, fmt.Errorf("go-nvlib's name for GPU instance profile %d, compute instance profile %d: %w", giInfo.ProfileId, ciInfo.ProfileId, err)
			}
			migs = append(migs, Mig{
				UUID:              "MIG-" + uuid.NewString(),
				Profile:           name.String(),
				GpuInstanceID:     giInfo.Id,
				ComputeInstanceID: ciInfo.Id,
				GpuInstanceSlices: profile.SliceCount,
				ComputeSlices:     ciProfile.SliceCount,
				PlacementStart:    giInfo.Placement.Start,
				MemoryBytes:       profile.MemorySizeMB * 1024 * 1024,
			})
		}
	}
	return migs, nil
}

func firstFree(candidates, used []nvml.GpuInstancePlacement) (nvml.GpuInstancePlacement, bool) {
	for _, c := range candidates {
		free := true
		for _, u := range used {
			if c.Start < u.Start+u.Size && u.Start < c.Start+c.Size {
				free = false
			}
		}
		if free {
			return c, true
		}
	}
	return nvml.GpuInstancePlacement{}, false
}

// scenarioDevice is the GPU in tests/fake-nvml's scenario format. The bus id is written as nvml.h's
// NVML_DEVICE_PCI_BUS_ID_FMT ("%08X:%02X:%02X.0") writes it in nvmlPciInfo_t.busId.
func scenarioDevice(gpu GpuAnswer) map[string]any {
	var domain, bus, dev, function uint32
	fmt.Sscanf(gpu.PciBusID, "%x:%x:%x.%x", &domain, &bus, &dev, &function)
	memory := map[string]any{"total": gpu.MemoryTotal, "used": gpu.MemoryUsed, "free": gpu.MemoryFree}
	d := map[string]any{
		"uuid":                    gpu.UUID,
		"name":                    gpu.Name,
		"pci_bus_id":              fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus, dev, function),
		"pci_device_id":           gpu.PciDeviceID,
		"minor_number":            gpu.Minor,
		"cuda_compute_capability": []int{gpu.CudaMajor, gpu.CudaMinor},
		"memory":                  memory,
		"unsupported":             gpu.NotModelled,
	}
	if gpu.MigMode == nvml.DEVICE_MIG_ENABLE {
		var instances []map[string]any
		for _, m := range gpu.MigDevices {
			instances = append(instances, map[string]any{
				"uuid":                m.UUID,
				"gpu_instance_id":     m.GpuInstanceID,
				"compute_instance_id": m.ComputeInstanceID,
				"profile":             m.Profile,
				// The mock has no MIG device handles: the instance's memory is its GPU instance
				// profile's, used and free as the mock answers them for the whole GPU.
				"memory": map[string]any{"total": m.MemoryBytes, "used": gpu.MemoryUsed, "free": gpu.MemoryFree},
			})
		}
		// The agent holds the mig/monitor capability where the shipped DaemonSet grants it; the
		// mock has no notion of it.
		d["mig"] = map[string]any{"enabled": true, "monitor_capability": true, "instances": instances}
	}
	return d
}

// PciDevice is nvpci's reading of one device of the tree.
type PciDevice struct {
	Address  string `json:"address"`
	Vendor   uint16 `json:"vendor"`
	Device   uint16 `json:"device"`
	Class    uint32 `json:"class"`
	Driver   string `json:"driver"`
	IsGPU    bool   `json:"is_gpu"`
	IsVF     bool   `json:"is_vf"`
	Physfn   string `json:"physfn,omitempty"`
	TotalVFs uint64 `json:"total_vfs,omitempty"`
	NumVFs   uint64 `json:"num_vfs,omitempty"`
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func pciCommand(args []string) (any, error) {
	flags := flag.NewFlagSet("pci", flag.ContinueOnError)
	a100 := flags.String("a100", "", "the A100 physical functions' addresses, comma-separated (0000:bb:dd.f)")
	var vfs, vfio list
	flags.Var(&vfs, "vfs", "ADDR=N: N SR-IOV virtual functions on the physical function at ADDR (repeatable)")
	flags.Var(&vfio, "vfio", "ADDR: bind that function to vfio-pci, as for a GPU handed to a VM (repeatable)")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	if *a100 == "" {
		return nil, fmt.Errorf("--a100 names no address")
	}
	sriov := map[string]uint64{}
	for _, v := range vfs {
		address, n, ok := strings.Cut(v, "=")
		count, err := strconv.ParseUint(n, 10, 8)
		if !ok || err != nil {
			return nil, fmt.Errorf("--vfs %q: ADDR=N", v)
		}
		sriov[address] = count
	}
	mock, err := nvpci.NewMockNvpci()
	if err != nil {
		return nil, err
	}
	for _, address := range strings.Split(*a100, ",") {
		var info *nvpci.SriovInfo
		if n, ok := sriov[address]; ok {
			info = &nvpci.SriovInfo{PhysicalFunction: &nvpci.SriovPhysicalFunction{TotalVFs: 16, NumVFs: n}}
		}
		if err := mock.AddMockA100(address, 0, info); err != nil {
			return nil, fmt.Errorf("AddMockA100(%s): %w", address, err)
		}
	}
	// The folder MockNvpci made under $TMPDIR, where it put every device.
	added, err := mock.GetAllDevices()
	if err != nil || len(added) == 0 {
		return nil, fmt.Errorf("nvpci GetAllDevices lists none of the added devices: %v", err)
	}
	root := filepath.Dir(added[0].Path)
	// The mock binds every function to the nvidia driver (its `driver` link ends in `nvidia`);
	// vfio-pci's binding is the same link to a driver of that name, as the kernel makes it.
	for _, address := range vfio {
		dir := filepath.Join(root, address)
		if err := os.WriteFile(filepath.Join(dir, "vfio-pci"), nil, 0o644); err != nil {
			return nil, err
		}
		if err := os.Remove(filepath.Join(dir, "driver")); err != nil {
			return nil, fmt.Errorf("--vfio %s: %w", address, err)
		}
		if err := os.Symlink(filepath.Join(dir, "vfio-pci"), filepath.Join(dir, "driver")); err != nil {
			return nil, err
		}
	}
	gpus, err := mock.GetGPUs()
	if err != nil {
		return nil, fmt.Errorf("nvpci GetGPUs: %w", err)
	}
	all, err := mock.GetAllDevices()
	if err != nil {
		return nil, fmt.Errorf("nvpci GetAllDevices: %w", err)
	}
	return map[string]any{"root": root, "gpus": pciDevices(gpus), "all": pciDevices(all)}, nil
}

func pciDevices(devices []*nvpci.NvidiaPCIDevice) []PciDevice {
	out := make([]PciDevice, 0, len(devices))
	for _, d := range devices {
		p := PciDevice{
			Address: d.Address, Vendor: d.Vendor, Device: d.Device, Class: d.Class,
			Driver: d.Driver, IsGPU: d.IsGPU(), IsVF: d.SriovInfo.IsVF(),
		}
		if d.SriovInfo.VirtualFunction != nil && d.SriovInfo.VirtualFunction.PhysicalFunction != nil {
			p.Physfn = d.SriovInfo.VirtualFunction.PhysicalFunction.Address
		}
		if d.SriovInfo.PhysicalFunction != nil {
			p.TotalVFs, p.NumVFs = d.SriovInfo.PhysicalFunction.TotalVFs, d.SriovInfo.PhysicalFunction.NumVFs
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}
