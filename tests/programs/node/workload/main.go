// Command workload is the tests' stand-in for an inference server in a container: it reads every
// file of its model folder as a server loads weights, then serves a readiness endpoint after a
// delay the test chooses. It logs each moment as a JSON line on standard output, its own
// timestamps, against which the agent's startup phases are checked.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

func say(event string, fields map[string]any) {
	line := map[string]any{"event": event, "at": time.Now().UTC().Format(time.RFC3339Nano)}
	for k, v := range fields {
		line[k] = v
	}
	out, _ := json.Marshal(line)
	fmt.Println(string(out))
}

func main() {
	model := flag.String("model", "", "the model folder whose files are read at start")
	readyAfter := flag.Duration("ready-after", 0, "how long after loading the readiness endpoint starts answering 200")
	listen := flag.String("listen", "127.0.0.1:8000", "where /health is served")
	exitAfterLoad := flag.Bool("exit-after-load", false, "exit once the model is read, serving nothing")
	crashOnce := flag.String("crash-once", "", "a file that, where it does not exist yet, is created and the program exits 1 once the model is read: a server that crashes on its first start (the file on a volume that outlives the container)")
	flag.Parse()
	// The seccomp mode the runtime put it under (2: a filter), from the kernel's own account.
	status, _ := os.ReadFile("/proc/self/status")
	seccomp := ""
	for _, line := range strings.Split(string(status), "\n") {
		if value, found := strings.CutPrefix(line, "Seccomp:"); found {
			seccomp = strings.TrimSpace(value)
		}
	}
	say("started", map[string]any{"seccomp": seccomp})
	var files, bytes int64
	if *model != "" {
		err := filepath.WalkDir(*model, func(path string, entry fs.DirEntry, err error) error {
			if err != nil || !entry.Type().IsRegular() {
				return err
			}
			file, err := os.Open(path)
			if err != nil {
				return err
			}
			defer file.Close()
			n, err := io.Copy(io.Discard, file)
			files, bytes = files+1, bytes+n
			return err
		})
		if err != nil {
			say("failed", map[string]any{"error": err.Error()})
			os.Exit(1)
		}
	}
	say("model_loaded", map[string]any{"files": files, "bytes": bytes})
	if *exitAfterLoad {
		return
	}
	if *crashOnce != "" {
		if _, err := os.Stat(*crashOnce); os.IsNotExist(err) {
			if err := os.WriteFile(*crashOnce, nil, 0o644); err != nil {
				say("failed", map[string]any{"error": err.Error()})
			}
			say("crashed", nil)
			os.Exit(1)
		}
	}
	readyAt := time.Now().Add(*readyAfter)
	var ready sync.Once
	http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		if time.Now().Before(readyAt) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		ready.Do(func() { say("ready", nil) })
		w.WriteHeader(http.StatusOK)
	})
	if err := http.ListenAndServe(*listen, nil); err != nil {
		say("failed", map[string]any{"error": err.Error()})
		os.Exit(1)
	}
}
