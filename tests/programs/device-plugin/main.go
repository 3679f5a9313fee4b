// A device plugin for the tests' node, on the kubelet's own device-plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1, pinned by this module's go.mod): it registers one
// extended resource (nvidia.com/gpu) with the devices it is given (the fake NVML's GPU UUIDs, as
// the NVIDIA device plugin names GPUs), so that the real kubelet allocates them to pods and its
// pod-resources API reports which pod holds which. Every device is reported Healthy for as long
// as it runs: it judges nothing, which is what lets a test tell the agent's verdict from the
// kubelet's allocatedResourcesStatus.
//
//	device-plugin --resource nvidia.com/gpu --devices GPU-a,GPU-b [--dir /var/lib/kubelet/device-plugins]
//
// It registers again whenever the kubelet's socket is made anew (a restarted kubelet forgets its
// plugins), and stops on SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	devices []*api.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-p.stop:
	case <-stream.Context().Done():
	}
	return nil
}

// Allocate hands each container the devices the kubelet chose, as the NVIDIA device plugin's
// default strategy does: NVIDIA_VISIBLE_DEVICES, which the NVIDIA container runtime reads.
func (p *plugin) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	response := &api.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		response.ContainerResponses = append(response.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(container.DevicesIds, ",")},
		})
	}
	return response, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func register(dir, endpoint, resource string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	connection, err := grpc.NewClient("unix://"+filepath.Join(dir, filepath.Base(api.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer connection.Close()
	_, err = api.NewRegistrationClient(connection).Register(ctx, &api.RegisterRequest{
		Version:      api.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &api.DevicePluginOptions{},
	})
	return err
}

// kubeletSocket is the kubelet's registration socket's inode: a new one is a restarted kubelet.
func kubeletSocket(dir string) uint64 {
	var stat syscall.Stat_t
	if syscall.Stat(filepath.Join(dir, filepath.Base(api.KubeletSocket)), &stat) != nil {
		return 0
	}
	return stat.Ino
}

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource to advertise")
	devices := flag.String("devices", "", "the device ids, comma-separated")
	dir := flag.String("dir", api.DevicePluginPath, "the kubelet's device-plugin folder")
	flag.Parse()
	if *devices == "" {
		log.Fatal("--devices names no device")
	}
	p := &plugin{stop: make(chan struct{})}
	for _, id := range strings.Split(*devices, ",") {
		p.devices = append(p.devices, &api.Device{ID: id, Health: api.Healthy})
	}
	endpoint := "mlnode-tests-" + strings.NewReplacer("/", "-", ".", "-").Replace(*resource) + ".sock"
	socket := filepath.Join(*dir, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Fatalf("serve: %v", err)
		}
	}()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	registered := uint64(0)
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-signals:
			close(p.stop)
			server.Stop()
			_ = os.Remove(socket)
			return
		case <-ticker.C:
			current := kubeletSocket(*dir)
			if current == 0 || current == registered {
				continue
			}
			if err := register(*dir, endpoint, *resource); err != nil {
				fmt.Fprintf(os.Stderr, "register %s with the kubelet: %v\n", *resource, err)
				continue
			}
			registered = current
			fmt.Printf("registered %s: %d device(s) %s\n", *resource, len(p.devices), *devices)
		}
	}
}
