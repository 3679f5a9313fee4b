// Command pause is the tests' pod sandbox image's one program, as the kubelet's pause container:
// the first process of a pod's shared namespaces, which holds them while the pod's containers come
// and go, reaps whatever exits under it, and ends on SIGTERM or SIGINT.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			return
		}
		// Orphans of the pod's shared PID namespace become this process's children.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
