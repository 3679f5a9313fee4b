// Command workload is the tests' stand-in for an inference server in a container: it reads every
// file of its model folder as a server loads weights, then serves a readiness endpoint after a
// delay the test chooses. It logs each moment as a JSON line on standard output, its own
// timestamps, against which the agent's startup phases are checked.
//
// With --serve it is a model store instead, serving a folder's files over HTTP at a held rate and,
// for a fault, cut short; with --download it is the download step of a pod's start, fetching
// files from such a store into a folder.
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
	serve := flag.String("serve", "", "serve this folder's files over HTTP at --listen instead, as a model store does")
	rate := flag.Int64("rate", 0, "with --serve, the bytes per second each response's body is held to (0: unheld)")
	cutAfter := flag.Int64("cut-after", 0, "with --serve, end each response after this many bytes of its body, its Content-Length still the whole file's: a download cut short")
	download := flag.String("download", "", "download --files from this base URL into --to instead")
	fetch := flag.String("files", "", "with --download, the files to fetch, comma-separated, relative to the base URL and to --to")
	to := flag.String("to", "", "with --download, the folder the files are written into")
	keepGoing := flag.Bool("keep-going", false, "with --download, exit 0 whatever failed, as a download step followed by `; echo done` does")
	afterVerified := flag.String("after-verified", "", "before loading, wait until the agent's metrics at this URL say model --verified-model was verified after its files were last written (polled every 10 ms): a server that loads at once after the agent's verification of its download")
	verifiedModel := flag.String("verified-model", "", "with --after-verified, the model's name in the agent's metrics")
	crashOnce := flag.String("crash-once", "", "a file that, where it does not exist yet, is created and the program exits 1 once the model is read: a server that crashes on its first start (the file on a volume that outlives the container)")
	flag.Parse()
	if *serve != "" {
		serveFiles(*serve, *listen, *rate, *cutAfter)
		return
	}
	if *download == "" || *model != "" {
		// The seccomp mode the runtime put it under (2: a filter), from the kernel's own account.
		status, _ := os.ReadFile("/proc/self/status")
		seccomp := ""
		for _, line := range strings.Split(string(status), "\n") {
			if value, found := strings.CutPrefix(line, "Seccomp:"); found {
				seccomp = strings.TrimSpace(value)
			}
		}
		say("started", map[string]any{"seccomp": seccomp})
	}
	// A download step; with --model too, a server that downloads part of its model itself first.
	if *download != "" {
		err := downloadFiles(*download, strings.Split(*fetch, ","), *to)
		if err != nil {
			say("download_failed", map[string]any{"error": err.Error()})
			if !*keepGoing {
				os.Exit(1)
			}
		}
		if *model == "" {
			return
		}
	}
	if *afterVerified != "" {
		at := awaitVerified(*afterVerified, *verifiedModel, lastWritten(*model))
		say("verified_seen", map[string]any{"verified_at": at})
	}
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

// serveFiles answers GET /<path> with the file at that path under root: its whole length in
// Content-Length, its body at rate bytes per second (0: unheld) and, where cutAfter is set, the
// connection ended after that many bytes of it.
func serveFiles(root, listen string, rate, cutAfter int64) {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		file, err := os.Open(filepath.Join(root, filepath.Clean("/"+r.URL.Path)))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer file.Close()
		info, err := file.Stat()
		if err != nil || !info.Mode().IsRegular() {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(info.Size()))
		w.WriteHeader(http.StatusOK)
		var body io.Reader = file
		if cutAfter > 0 {
			body = io.LimitReader(file, cutAfter)
		}
		started, sent := time.Now(), int64(0)
		buffer := make([]byte, 64<<10)
		for {
			n, err := body.Read(buffer)
			if n > 0 {
				if _, err := w.Write(buffer[:n]); err != nil {
					return
				}
				sent += int64(n)
				if rate > 0 {
					time.Sleep(time.Until(started.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))))
				}
			}
			if err != nil {
				break
			}
		}
		if sent < info.Size() {
			say("cut", map[string]any{"path": r.URL.Path, "bytes": sent})
			// Ending the handler without the rest: the server closes the connection short.
			panic(http.ErrAbortHandler)
		}
	})
	say("serving", map[string]any{"root": root})
	if err := http.ListenAndServe(listen, nil); err != nil {
		say("failed", map[string]any{"error": err.Error()})
		os.Exit(1)
	}
}

// lastWritten is the newest modification time of the files under folder.
func lastWritten(folder string) time.Time {
	var newest time.Time
	_ = filepath.WalkDir(folder, func(path string, entry fs.DirEntry, err error) error {
		if err != nil || !entry.Type().IsRegular() {
			return err
		}
		if info, err := entry.Info(); err == nil && info.ModTime().After(newest) {
			newest = info.ModTime()
		}
		return nil
	})
	return newest
}

// awaitVerified polls the agent's metrics until the model's last verification ended after since,
// and returns when it ended (Unix seconds, the agent's clock).
func awaitVerified(url, model string, since time.Time) float64 {
	// The series carries the agent's other labels too (Hostname).
	name, label := "mlnode_model_cache_last_verified_timestamp_seconds{", fmt.Sprintf("model_name=%q", model)
	said, seen := time.Now(), ""
	for {
		response, err := http.Get(url)
		if time.Since(said) > 5*time.Second {
			said = time.Now()
			say("awaiting_verification", map[string]any{"since": since, "error": fmt.Sprint(err), "seen": seen})
		}
		if err == nil {
			body, _ := io.ReadAll(response.Body)
			response.Body.Close()
			for _, line := range strings.Split(string(body), "\n") {
				end := strings.LastIndex(line, "} ")
				if !strings.HasPrefix(line, name) || end < 0 || !strings.Contains(line[:end], label) {
					continue
				}
				value := line[end+2:]
				seen = value
				var at float64
				if _, err := fmt.Sscan(value, &at); err == nil && at > float64(since.UnixNano())/1e9 {
					return at
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// downloadFiles fetches each of paths from base into the folder to, as a pod's download step
// does; a body shorter than its Content-Length is an error, what was written of it left in place.
func downloadFiles(base string, paths []string, to string) error {
	say("download_started", map[string]any{"from": base})
	var total int64
	for _, path := range paths {
		response, err := http.Get(strings.TrimSuffix(base, "/") + "/" + path)
		if err != nil {
			return err
		}
		if response.StatusCode != http.StatusOK {
			response.Body.Close()
			return fmt.Errorf("%s: HTTP %d", path, response.StatusCode)
		}
		target := filepath.Join(to, path)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			response.Body.Close()
			return err
		}
		file, err := os.Create(target)
		if err != nil {
			response.Body.Close()
			return err
		}
		n, err := io.Copy(file, response.Body)
		response.Body.Close()
		file.Close()
		total += n
		if err != nil {
			return fmt.Errorf("%s: %d of %d bytes: %w", path, n, response.ContentLength, err)
		}
		say("downloaded_file", map[string]any{"path": path, "bytes": n})
	}
	say("downloaded", map[string]any{"files": len(paths), "bytes": total})
	return nil
}
