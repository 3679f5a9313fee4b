// Command control-plane runs a real Kubernetes control plane for mlnode-agent's tests: etcd in
// process (go.etcd.io/etcd/server/v3/embed) and kube-apiserver's own command
// (k8s.io/kubernetes/cmd/kube-apiserver/app, the code the kube-apiserver binary runs), both on
// loopback only, with what a cluster's agents meet: RBAC and Node authorization, the default
// admission plugins and NodeRestriction, API Priority and Fairness, and a service-account issuer
// whose bound tokens carry the node name of the pod they are bound to.
//
// Once the server answers /readyz it writes an admin kubeconfig (client certificate in
// system:masters) where --kubeconfig says; a caller waits for that file. SIGTERM or SIGINT stops the
// server gracefully, then etcd.
//
//	control-plane --dir STATE --kubeconfig PATH [-- extra kube-apiserver flags]
//
// The two can also run as processes of their own, as in a cluster, so that each one's CPU and
// memory is measured apart and kube-apiserver can be restarted on etcd's data while etcd runs on:
//
//	control-plane --dir STATE --etcd-url-file PATH              etcd alone; its client URL written to PATH once ready
//	control-plane --dir STATE --kubeconfig PATH --etcd URL [--port N] [-- flags]   kube-apiserver alone, on that etcd
//	control-plane --compact URL                                 that etcd compacted to its head revision
//
// STATE keeps etcd's data and the certificates and keys; started again on the same STATE it serves
// the same objects, and tokens issued before stay valid.
//
// The rest of a cluster, for the tests' node, from the same Kubernetes modules and one build:
//
//	control-plane kubelet|kube-scheduler|kube-controller-manager [flags]   that component's own command
//	control-plane --dir STATE --node-credentials NAME --server URL --out DIR
//	    a kubelet's kubeconfig for node NAME: a client certificate in system:nodes signed by STATE's CA
//	control-plane --forward FROM=TO [--rate BYTES]   every connection accepted on FROM copied both
//	    ways to TO, each tcp:HOST:PORT or unix:PATH: the bridge between the node's network namespace
//	    and loopback; with --rate, TO's answers held to that many bytes a second (a registry's link)
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// The issuer and audience a real cluster's API server uses by default (kubeadm's), so tokens look
// like a node's.
const issuer = "https://kubernetes.default.svc.cluster.local"

const readyTimeout = 3 * time.Minute

// The node's components, each the command its own binary runs.
var components = map[string]func() *cobra.Command{
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
}

func main() {
	if len(os.Args) > 1 {
		if component, ok := components[os.Args[1]]; ok {
			command := component()
			command.SetArgs(os.Args[2:])
			os.Exit(cli.Run(command))
		}
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "control-plane: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "", "folder for etcd's data and the certificates and keys (created if missing)")
	kubeconfig := flag.String("kubeconfig", "", "where to write the admin kubeconfig once the server is ready")
	etcdURLFile := flag.String("etcd-url-file", "", "run etcd alone and write its client URL here once it is ready")
	external := flag.String("etcd", "", "run kube-apiserver alone, on the etcd at this client URL")
	fixedPort := flag.Int("port", 0, "kube-apiserver's port on 127.0.0.1 (0: a free one), so that a restart keeps its clients' address")
	compact := flag.String("compact", "", "compact the etcd at this client URL to its head revision, then exit")
	nodeName := flag.String("node-credentials", "", "write a kubelet's kubeconfig for this node (with --server and --out), then exit")
	nodeServer := flag.String("server", "", "the API server's URL as the node reaches it, for --node-credentials")
	nodeOut := flag.String("out", "", "the folder for --node-credentials' kubeconfig, certificate and key")
	forwarding := flag.String("forward", "", "FROM=TO: copy every connection accepted on FROM to TO (tcp:HOST:PORT or unix:PATH)")
	forwardRate := flag.Int("rate", 0, "with --forward: hold what TO sends back to this many bytes a second over all connections (0: as fast as it goes)")
	flag.Parse()
	if *compact != "" {
		return compactToHead(*compact)
	}
	if *forwarding != "" {
		if *forwardRate < 0 {
			return fmt.Errorf("--rate %d: a rate is 0 (none) or more bytes a second", *forwardRate)
		}
		return forward(*forwarding, *forwardRate)
	}
	if *nodeName != "" {
		if *dir == "" || *nodeServer == "" || *nodeOut == "" {
			return errors.New("--node-credentials needs --dir, --server and --out")
		}
		return writeNodeCredentials(filepath.Join(*dir, "pki"), *nodeName, *nodeServer, *nodeOut)
	}
	if *dir == "" || (*kubeconfig == "") == (*etcdURLFile == "") {
		return errors.New("--dir and one of --kubeconfig (kube-apiserver) or --etcd-url-file (etcd alone) are required")
	}
	state, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if *etcdURLFile != "" {
		return serveEtcd(filepath.Join(state, "etcd"), *etcdURLFile)
	}
	pki, err := ensurePKI(filepath.Join(state, "pki"))
	if err != nil {
		return fmt.Errorf("certificates in %s: %w", state, err)
	}
	etcdURL := *external
	if etcdURL == "" {
		etcd, url, err := startEtcd(filepath.Join(state, "etcd"))
		if err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		defer etcd.Close()
		etcdURL = url
	}

	port := *fixedPort
	if port == 0 {
		if port, err = freeLoopbackPort(); err != nil {
			return fmt.Errorf("kube-apiserver port: %w", err)
		}
	}
	args := append([]string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--etcd-servers=" + etcdURL,
		"--cert-dir=" + pki.dir,
		"--tls-cert-file=" + pki.servingCert,
		"--tls-private-key-file=" + pki.servingKey,
		"--client-ca-file=" + pki.caCert,
		"--service-account-issuer=" + issuer,
		"--api-audiences=" + issuer,
		"--service-account-key-file=" + pki.serviceAccountPublicKey,
		"--service-account-signing-key-file=" + pki.serviceAccountKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--enable-priority-and-fairness=true",
		"--allow-privileged=true",
		"--profiling=false",
		// The kubernetes Service's endpoints would name 127.0.0.1, which Endpoints refuse.
		"--endpoint-reconciler-type=none",
	}, flag.Args()...)

	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	ctx, stopWaiting := context.WithCancel(context.Background())
	defer stopWaiting()
	go func() {
		if err := awaitReady(ctx, server, pki); err != nil {
			if ctx.Err() != nil {
				return // kube-apiserver ended first and says why
			}
			fmt.Fprintf(os.Stderr, "control-plane: kube-apiserver at %s: %v\n", server, err)
			os.Exit(1)
		}
		if err := writeKubeconfig(*kubeconfig, server, pki.caCert, "admin", pki.adminCert, pki.adminKey); err != nil {
			fmt.Fprintf(os.Stderr, "control-plane: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("control-plane: ready at %s, kubeconfig %s\n", server, *kubeconfig)
	}()

	command := app.NewAPIServerCommand()
	command.SetArgs(args)
	if code := cli.Run(command); code != 0 {
		return fmt.Errorf("kube-apiserver exited with status %d", code)
	}
	return nil
}

type pkiFiles struct {
	dir, caCert, caKey, servingCert, servingKey, adminCert, adminKey string
	serviceAccountKey, serviceAccountPublicKey                       string
}

// ensurePKI creates a CA, the server's serving certificate, an admin client certificate and the
// service-account signing key, or keeps those a previous run left.
func ensurePKI(dir string) (pkiFiles, error) {
	files := pkiFiles{
		dir:                     dir,
		caCert:                  filepath.Join(dir, "ca.crt"),
		caKey:                   filepath.Join(dir, "ca.key"),
		servingCert:             filepath.Join(dir, "apiserver.crt"),
		servingKey:              filepath.Join(dir, "apiserver.key"),
		adminCert:               filepath.Join(dir, "admin.crt"),
		adminKey:                filepath.Join(dir, "admin.key"),
		serviceAccountKey:       filepath.Join(dir, "service-account.key"),
		serviceAccountPublicKey: filepath.Join(dir, "service-account.pub"),
	}
	if _, err := os.Stat(files.serviceAccountKey); err == nil {
		return files, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return files, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, err
	}
	caTemplate := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "mlnode-test-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTemplate, &caKey.PublicKey, caTemplate, caKey)
	if err != nil {
		return files, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return files, err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	admin := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "mlnode-test-admin", Organization: []string{"system:masters"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, leaf := range []struct {
		template  *x509.Certificate
		cert, key string
	}{{serving, files.servingCert, files.servingKey}, {admin, files.adminCert, files.adminKey}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return files, err
		}
		der, err := sign(leaf.template, &key.PublicKey, ca, caKey)
		if err != nil {
			return files, err
		}
		if err := writeCertAndKey(leaf.cert, der, leaf.key, key); err != nil {
			return files, err
		}
	}
	if err := writeCertAndKey(files.caCert, caDER, files.caKey, caKey); err != nil {
		return files, err
	}
	serviceAccountKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, err
	}
	public, err := x509.MarshalPKIXPublicKey(&serviceAccountKey.PublicKey)
	if err != nil {
		return files, err
	}
	if err := os.WriteFile(files.serviceAccountPublicKey, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: public}), 0o644); err != nil {
		return files, err
	}
	// Written last: its presence says the whole set is there.
	return files, writeKey(files.serviceAccountKey, serviceAccountKey)
}

func sign(template *x509.Certificate, public *ecdsa.PublicKey, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	template.SerialNumber = serial
	template.NotBefore = time.Now().Add(-time.Hour)
	template.NotAfter = time.Now().Add(10 * 365 * 24 * time.Hour)
	return x509.CreateCertificate(rand.Reader, template, parent, public, parentKey)
}

func writeCertAndKey(certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeKey(keyPath, key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	clientPort, err := freeLoopbackPort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freeLoopbackPort()
	if err != nil {
		return nil, "", err
	}
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	config := embed.NewConfig()
	config.Dir = dataDir
	config.ListenClientUrls = []url.URL{client}
	config.AdvertiseClientUrls = []url.URL{client}
	config.ListenPeerUrls = []url.URL{peer}
	config.AdvertisePeerUrls = []url.URL{peer}
	config.InitialCluster = config.InitialClusterFromName(config.Name)
	config.LogLevel = "error"
	etcd, err := embed.StartEtcd(config)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-etcd.Server.ReadyNotify():
		return etcd, client.String(), nil
	case err := <-etcd.Err():
		etcd.Close()
		return nil, "", err
	case <-time.After(readyTimeout):
		etcd.Close()
		return nil, "", fmt.Errorf("not ready within %s", readyTimeout)
	}
}

// serveEtcd runs etcd alone until SIGTERM or SIGINT, its client URL written (through a rename)
// to urlFile once it is ready.
func serveEtcd(dataDir, urlFile string) error {
	etcd, url, err := startEtcd(dataDir)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	if err := writeThroughRename(urlFile, []byte(url), 0o644); err != nil {
		return err
	}
	select {
	case <-signals:
		return nil
	case err := <-etcd.Err():
		return fmt.Errorf("etcd: %w", err)
	}
}

// compactToHead compacts etcd's history up to its current revision, physically, as
// kube-apiserver's own compactor does every --etcd-compaction-interval: every watch that asks to
// resume from an earlier revision is then answered "required revision has been compacted".
func compactToHead(url string) error {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("etcd at %s: %w", url, err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	head, err := client.Get(ctx, "compact-probe")
	if err != nil {
		return fmt.Errorf("etcd at %s: its revision: %w", url, err)
	}
	revision := head.Header.Revision
	if _, err := client.Compact(ctx, revision, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("etcd at %s: compaction to %d: %w", url, revision, err)
	}
	fmt.Println(revision)
	return nil
}

// freeLoopbackPort asks the kernel for a free port on 127.0.0.1; kube-apiserver's own flags take a
// port, not a listener.
func freeLoopbackPort() (int, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port, nil
}

func adminTLS(pki pkiFiles) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(pki.adminCert, pki.adminKey)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(pki.caCert)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots}, nil
}

// awaitReady polls /readyz, which answers 200 only once every post-start hook (RBAC's bootstrap
// roles, Priority and Fairness' configuration among them) has run.
func awaitReady(ctx context.Context, server string, pki pkiFiles) error {
	tlsConfig, err := adminTLS(pki)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(readyTimeout)
	for {
		response, err := client.Get(server + "/readyz")
		if err == nil {
			response.Body.Close()
			if response.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %s (last: %v)", readyTimeout, describe(response, err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func describe(response *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return response.Status
}

// writeKubeconfig writes a kubeconfig for `user`'s client certificate, with it, its key and the
// cluster's CA embedded, through a rename, so a caller waiting for the file never reads half of it.
func writeKubeconfig(path, server, caCert, user, cert, key string) error {
	config := clientcmdapi.NewConfig()
	config.Clusters["mlnode-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caCert}
	config.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}
	config.Contexts[user] = &clientcmdapi.Context{Cluster: "mlnode-test", AuthInfo: user}
	config.CurrentContext = user
	if err := clientcmdapi.FlattenConfig(config); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	content, err := clientcmd.Write(*config)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	return writeThroughRename(path, content, 0o600)
}

// writeThroughRename writes a file that a caller waits for under another name first, so that the
// caller never reads half of it.
func writeThroughRename(path string, content []byte, mode os.FileMode) error {
	partial := path + ".partial"
	if err := os.WriteFile(partial, content, mode); err != nil {
		return fmt.Errorf("%s: %w", partial, err)
	}
	return os.Rename(partial, path)
}
