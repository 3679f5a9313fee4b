package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/time/rate"
)

// writeNodeCredentials gives node `name` what kubeadm's TLS bootstrap ends with: a client
// certificate for system:node:<name> in system:nodes, so that the Node authorizer and
// NodeRestriction judge the kubelet as they judge a cluster's, and a kubeconfig naming it and the
// cluster's CA. The CA's key stays in the control plane's folder.
func writeNodeCredentials(pkiDir, name, server, out string) error {
	caPair, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, "ca.crt"), filepath.Join(pkiDir, "ca.key"))
	if err != nil {
		return fmt.Errorf("the cluster's CA in %s: %w", pkiDir, err)
	}
	ca, err := x509.ParseCertificate(caPair.Certificate[0])
	if err != nil {
		return err
	}
	caKey, ok := caPair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return errors.New("the cluster's CA key is not ECDSA")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, &key.PublicKey, ca, caKey)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	cert, keyFile := filepath.Join(out, "kubelet.crt"), filepath.Join(out, "kubelet.key")
	if err := writeCertAndKey(cert, der, keyFile, key); err != nil {
		return err
	}
	// The kubelet's endpoint trusts the same CA for its clients (clientCAFile).
	caPEM, err := os.ReadFile(filepath.Join(pkiDir, "ca.crt"))
	if err != nil {
		return err
	}
	caFile := filepath.Join(out, "ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		return err
	}
	return writeKubeconfig(filepath.Join(out, "kubelet.kubeconfig"), server, caFile, "kubelet", cert, keyFile)
}

// forward copies every connection accepted on FROM to a new connection to TO, both ways, until
// killed. The node lives in a network namespace of its own, and a unix socket's path is the one
// address both it and the machine's loopback can reach: one forwarder on each side joins them.
// With bytesPerSecond above 0, what TO sends back over all connections together is held to that
// rate, as a node's link to its registry holds a pull.
func forward(spec string, bytesPerSecond int) error {
	from, to, ok := strings.Cut(spec, "=")
	if !ok {
		return fmt.Errorf("--forward %q: want FROM=TO", spec)
	}
	fromNetwork, fromAddress, err := endpoint(from)
	if err != nil {
		return err
	}
	toNetwork, toAddress, err := endpoint(to)
	if err != nil {
		return err
	}
	if fromNetwork == "unix" {
		_ = os.Remove(fromAddress) // a socket file left by a forwarder that was killed
	}
	listener, err := net.Listen(fromNetwork, fromAddress)
	if err != nil {
		return fmt.Errorf("--forward: listening on %s: %w", from, err)
	}
	var link *rate.Limiter
	if bytesPerSecond > 0 {
		link = rate.NewLimiter(rate.Limit(bytesPerSecond), linkBurst)
	}
	fmt.Printf("control-plane: forwarding %s to %s\n", from, to)
	for {
		accepted, err := listener.Accept()
		if err != nil {
			return fmt.Errorf("--forward: accepting on %s: %w", from, err)
		}
		go func() {
			defer accepted.Close()
			dialed, err := net.Dial(toNetwork, toAddress)
			if err != nil {
				fmt.Fprintf(os.Stderr, "control-plane: --forward: %s: %v\n", to, err)
				return
			}
			defer dialed.Close()
			var copies sync.WaitGroup
			copies.Add(2)
			go func() { defer copies.Done(); halfCopy(dialed, accepted, nil) }()
			go func() { defer copies.Done(); halfCopy(accepted, dialed, link) }()
			copies.Wait()
		}()
	}
}

// The most a rate-held link sends at once: small beside a second's worth at the rates the tests
// set, so a transfer's time follows the rate.
const linkBurst = 32 << 10

// halfCopy copies one direction, held to `link`'s rate where it is set, then passes the end of the
// stream on, so that each side sees the other close as it would without the forwarder.
func halfCopy(to, from net.Conn, link *rate.Limiter) {
	if link == nil {
		_, _ = io.Copy(to, from)
	} else {
		buffer := make([]byte, linkBurst)
		for {
			n, err := from.Read(buffer)
			if n > 0 {
				if link.WaitN(context.Background(), n) != nil {
					break
				}
				if _, err := to.Write(buffer[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
	}
	if closer, ok := to.(interface{ CloseWrite() error }); ok {
		_ = closer.CloseWrite()
	} else {
		_ = to.Close()
	}
}

func endpoint(spec string) (network, address string, err error) {
	network, address, ok := strings.Cut(spec, ":")
	if !ok || (network != "tcp" && network != "unix") || address == "" {
		return "", "", fmt.Errorf("--forward: %q is neither tcp:HOST:PORT nor unix:PATH", spec)
	}
	return network, address, nil
}
