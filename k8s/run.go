package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodelease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

// The files `run` keeps in its directory.
const (
	kubeconfigFile = "kubeconfig"
	readyFile      = "ready"
	pidFile        = "controlplane.pid"
	logFile        = "controlplane.log"
)

// A child process: one component, its log file in the run directory.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

type runOptions struct {
	dir, fleet string
	timeout    time.Duration
}

func parseRunFlags(name string, args []string) (runOptions, error) {
	var o runOptions
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", ".k8s", "the control plane's directory: kubeconfig, certificates, etcd's data, logs")
	fs.StringVar(&o.fleet, "fleet", "examples/fleets/k8s-demo.yaml", "the nodes to create (kwok runs them); empty for none")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long to wait for the control plane to be ready")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	dir, err := filepath.Abs(o.dir)
	o.dir = dir
	if err == nil && o.fleet != "" {
		o.fleet, err = filepath.Abs(o.fleet)
	}
	return o, err
}

// run starts etcd (in this process), kube-apiserver, kube-scheduler, kube-controller-manager and
// kwok (each this binary again, as its own process), creates the fleet's nodes, writes
// DIR/kubeconfig and DIR/ready, prints "ready DIR/kubeconfig", and stops everything on
// SIGTERM or SIGINT. Its children get SIGKILL if this process dies without stopping them.
func run(args []string) int {
	o, err := parseRunFlags("run", args)
	if err != nil {
		return 2
	}
	// Children's parent-death signal follows the thread that started them: keep to one thread.
	runtime.LockOSThread()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// SIGUSR1 stops kube-apiserver alone, SIGUSR2 starts it again (restartAPIServer); registered
	// now so that neither kills the process before it is ready.
	apiSignals := make(chan os.Signal, 4)
	signal.Notify(apiSignals, syscall.SIGUSR1, syscall.SIGUSR2)

	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fail(err)
	}
	_ = os.Remove(filepath.Join(o.dir, readyFile))
	if err := os.WriteFile(filepath.Join(o.dir, pidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fail(err)
	}
	defer os.Remove(filepath.Join(o.dir, pidFile))

	var children []*child
	var etcd *embed.Etcd
	shutdown := func() {
		// The reverse of the start order: kwok and the controllers first, etcd last.
		for i := len(children) - 1; i >= 0; i-- {
			children[i].stop(15 * time.Second)
		}
		if etcd != nil {
			etcd.Close()
		}
		_ = os.Remove(filepath.Join(o.dir, readyFile))
	}
	defer shutdown()

	// stopped ends at SIGTERM or SIGINT; ctx, for starting, also at the timeout.
	stopped, stopping := context.WithCancel(context.Background())
	defer stopping()
	go func() {
		<-stop
		stopping()
	}()
	ctx, cancel := context.WithTimeout(stopped, o.timeout)
	defer cancel()

	// No state is kept between runs: a fresh etcd and fresh certificates each time.
	for _, sub := range []string{"etcd", "pki", "logs"} {
		_ = os.RemoveAll(filepath.Join(o.dir, sub))
		if err := os.MkdirAll(filepath.Join(o.dir, sub), 0o700); err != nil {
			return fail(err)
		}
	}
	ports, err := freePorts(6)
	if err != nil {
		return fail(err)
	}
	etcdPort, etcdPeerPort, apiPort, schedPort, cmPort, kwokPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]

	pki, err := writePKI(filepath.Join(o.dir, "pki"))
	if err != nil {
		return fail(err)
	}

	etcd, err = startEtcd(filepath.Join(o.dir, "etcd"), filepath.Join(o.dir, "logs", "etcd.log"), etcdPort, etcdPeerPort)
	if err != nil {
		return fail(fmt.Errorf("etcd: %w", err))
	}

	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	start := func(name string, args ...string) (*child, error) {
		c, err := startChild(o.dir, self, name, args)
		if err == nil {
			children = append(children, c)
		}
		return c, err
	}

	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	apiArgs := []string{
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(apiPort),
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--tls-cert-file=" + pki.serverCert, "--tls-private-key-file=" + pki.serverKey,
		"--client-ca-file=" + pki.caCert,
		"--token-auth-file=" + pki.tokens,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.saKey, "--service-account-signing-key-file=" + pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
	}
	api, err := start("kube-apiserver", apiArgs...)
	if err != nil {
		return fail(err)
	}

	kubeconfig := filepath.Join(o.dir, kubeconfigFile)
	if err := writeKubeconfig(kubeconfig, server, pki.caCert, pki.adminToken); err != nil {
		return fail(err)
	}
	clients, err := newClient(kubeconfig)
	if err != nil {
		return fail(err)
	}
	apiReady := func(ctx context.Context, api *child) error {
		return waitFor(ctx, "kube-apiserver /readyz", []*child{api}, func() error {
			body, err := clients.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("%v: %s", err, body)
			}
			return nil
		})
	}
	if err := apiReady(ctx, api); err != nil {
		return fail(err)
	}

	sched, err := start("kube-scheduler",
		"--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(schedPort),
		"--leader-elect=false",
	)
	if err != nil {
		return fail(err)
	}
	cm, err := start("kube-controller-manager",
		"--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(cmPort),
		"--leader-elect=false",
		"--controllers=*",
		"--service-account-private-key-file="+pki.saKey, "--root-ca-file="+pki.caCert,
		"--cluster-signing-cert-file="+pki.caCert, "--cluster-signing-key-file="+pki.caKey,
		"--use-service-account-credentials=false",
	)
	if err != nil {
		return fail(err)
	}
	kwokConfig := filepath.Join(o.dir, "kwok.yaml")
	if err := writeKwokConfig(kwokConfig); err != nil {
		return fail(err)
	}
	kwok, err := start("kwok",
		"--config="+kwokConfig,
		"--kubeconfig="+kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+kwokNodeAnnotation+"=fake",
		"--node-ip=127.0.0.1",
		"--cidr=127.8.0.1/16", // pod IPs on the loopback: a test can run a pod's process (a kernel) at its IP
		"--node-lease-duration-seconds=40",
		"--server-address="+fmt.Sprintf("127.0.0.1:%d", kwokPort),
	)
	if err != nil {
		return fail(err)
	}
	all := []*child{api, sched, cm, kwok}
	for _, component := range []struct {
		name string
		port int
	}{{"kube-scheduler", schedPort}, {"kube-controller-manager", cmPort}} {
		address := fmt.Sprintf("https://127.0.0.1:%d/healthz", component.port)
		if err := waitFor(ctx, component.name+" /healthz", all, func() error { return httpsOK(address) }); err != nil {
			return fail(err)
		}
	}

	names := []string(nil)
	if o.fleet != "" {
		if names, err = createNodes(ctx, clients, o.fleet); err != nil {
			return fail(err)
		}
	}
	if err := waitFor(ctx, "the fleet's nodes Ready, the default service account", all, func() error {
		for _, name := range names {
			node, err := clients.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(node) {
				return fmt.Errorf("node %s is not Ready yet", name)
			}
		}
		_, err := clients.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return fail(err)
	}

	ready := fmt.Sprintf("kubeconfig: %s\nserver: %s\nnodes: %d\n", kubeconfig, server, len(names))
	if err := os.WriteFile(filepath.Join(o.dir, readyFile), []byte(ready), 0o644); err != nil {
		return fail(err)
	}
	fmt.Printf("ready %s\n", kubeconfig)

	// Until asked to stop, or until a component ends on its own (which is a failure); meanwhile
	// SIGUSR1 and SIGUSR2 stop and start kube-apiserver.
	exited := make(chan *child, 2*len(all))
	follow := func(c *child) {
		go func() {
			<-c.done
			exited <- c
		}()
	}
	for _, c := range all {
		follow(c)
	}
	apiDown := false
	onPurpose := map[*child]bool{} // the apiservers stopped by SIGUSR1
	for {
		select {
		case <-stopped.Done():
			fmt.Println("stopping")
			return 0
		case c := <-exited:
			if !onPurpose[c] {
				return fail(fmt.Errorf("%s ended on its own; see %s", c.name, filepath.Join(o.dir, "logs", c.name+".log")))
			}
		case err := <-etcd.Err():
			return fail(fmt.Errorf("etcd: %w", err))
		case sig := <-apiSignals:
			switch {
			case sig == syscall.SIGUSR1 && !apiDown:
				apiDown, onPurpose[api] = true, true
				// It stops listening at once, then can wait a minute for its watches to drain:
				// killed after 5 s, as an outage would end it.
				api.stop(5 * time.Second)
				fmt.Println("kube-apiserver stopped")
			case sig == syscall.SIGUSR2 && apiDown:
				restarted, err := restartAPIServer(stopped, o, self, apiArgs, apiReady)
				if err != nil {
					return fail(err)
				}
				for i := range children {
					if children[i] == api {
						children[i] = restarted
					}
				}
				api, apiDown = restarted, false
				follow(api)
				fmt.Println("kube-apiserver ready")
			default:
				fmt.Printf("kube-apiserver is %s already\n", map[bool]string{true: "stopped", false: "running"}[apiDown])
			}
		}
	}
}

// restartAPIServer starts kube-apiserver again with the same flags (the same port, certificates
// and etcd, whose data it finds as it was) and waits until it is ready; its log goes on in the
// same file. The other components reconnect by themselves.
func restartAPIServer(stopped context.Context, o runOptions, self string, args []string,
	ready func(context.Context, *child) error) (*child, error) {
	ctx, cancel := context.WithTimeout(stopped, o.timeout)
	defer cancel()
	api, err := startChild(o.dir, self, "kube-apiserver", args)
	if err != nil {
		return nil, err
	}
	if err := ready(ctx, api); err != nil {
		api.stop(15 * time.Second)
		return nil, fmt.Errorf("restarting: %w", err)
	}
	return api, nil
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "controlplane:", err)
	return 1
}

// startChild runs this binary as one component, its output in DIR/logs/NAME.log.
func startChild(dir, self, name string, args []string) (*child, error) {
	// Appended to: a component started again (kube-apiserver) keeps its earlier log.
	log, err := os.OpenFile(filepath.Join(dir, "logs", name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		log.Close()
		c.done <- err
		close(c.done)
	}()
	return c, nil
}

// stop asks the component to end (SIGTERM), and kills it after the grace period.
func (c *child) stop(grace time.Duration) {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// waitFor polls check until it succeeds, a component ends, or ctx ends.
// Each wait's length is printed: a slow start-up says where its time went.
func waitFor(ctx context.Context, what string, components []*child, check func() error) error {
	began := time.Now()
	var last error
	for {
		if last = check(); last == nil {
			fmt.Printf("%s: %.1f s\n", what, time.Since(began).Seconds())
			return nil
		}
		for _, c := range components {
			select {
			case <-c.done:
				return fmt.Errorf("%s ended while waiting for %s (after %.1f s)", c.name, what, time.Since(began).Seconds())
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w after %.1f s (last: %v)", what, ctx.Err(), time.Since(began).Seconds(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// httpsOK is nil when a component's self-signed health endpoint answers 200.
func httpsOK(address string) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // its own throwaway self-signed certificate
	response, err := client.Get(address)
	if err != nil {
		return err
	}
	response.Body.Close()
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", address, response.Status)
	}
	return nil
}

// freePorts returns n distinct loopback ports free now, drawn at random from below the kernel's
// ephemeral range: a port from that range (the kernel's choice for bind to port 0 and for every
// outgoing connection) can be taken by another process between this check and the component's
// bind, which on a busy test machine ended a start-up with a component that could not listen.
func freePorts(n int) ([]int, error) {
	low, high := 15000, 32000
	if text, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fields := strings.Fields(string(text)); len(fields) == 2 {
			if first, err := strconv.Atoi(fields[0]); err == nil && first-1 < high {
				high = first - 1
			}
		}
	}
	if high-low < 1000 {
		low = 1024
	}
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no %d free ports in %d-%d after %d tries", n, low, high, tries)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", low+rand.IntN(high-low+1)))
		if err != nil {
			continue
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startEtcd runs a single-member etcd on loopback; fsync is off (a throwaway store).
func startEtcd(dir, log string, clientPort, peerPort int) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "controlplane"
	cfg.Dir = dir
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{log}
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("not ready after 60 s")
	}
}

// writeKubeconfig writes an admin kubeconfig (bearer token in system:masters) for the server.
func writeKubeconfig(path, server, caFile, token string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	config := clientcmdapi.NewConfig()
	config.Clusters["gpualloc-local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	config.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	config.Contexts["gpualloc-local"] = &clientcmdapi.Context{Cluster: "gpualloc-local", AuthInfo: "admin"}
	config.CurrentContext = "gpualloc-local"
	return clientcmd.WriteToFile(*config, path)
}

func newClient(kubeconfig string) (*kubernetes.Clientset, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	config.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(config)
}

// phaseAnnotation lets a test hold a pod Running or end it: kwok's pod-complete stage leaves pods
// that carry it alone (so a Job's pod annotated "Running" runs until told), and our stages end a
// Running pod annotated "Succeeded" (exit code 0) or "Failed" (exit code 1).
const phaseAnnotation = "gpualloc.test/phase"

// writeKwokConfig gives kwok the stages kwokctl gives it by default, from kwok's own module:
// nodes become Ready and keep a lease heartbeat; pods become Running; pods owned by a Job then
// Succeed (unless they carry phaseAnnotation); deleted pods go. Then our two stages for
// phaseAnnotation.
func writeKwokConfig(path string) error {
	var complete map[string]any
	if err := yaml.Unmarshal([]byte(podfast.DefaultPodComplete), &complete); err != nil {
		return err
	}
	selector := complete["spec"].(map[string]any)["selector"].(map[string]any)
	selector["matchExpressions"] = append(selector["matchExpressions"].([]any),
		map[string]any{"key": fmt.Sprintf(".metadata.annotations[%q]", phaseAnnotation), "operator": "DoesNotExist"})
	completeYAML, err := yaml.Marshal(complete)
	if err != nil {
		return err
	}
	stages := []string{nodefast.DefaultNodeInit, nodelease.DefaultNodeHeartbeatWithLease,
		podfast.DefaultPodReady, string(completeYAML), podfast.DefaultPodDelete,
		podEndStage("Succeeded", 0, "Completed"), podEndStage("Failed", 1, "Error")}
	return os.WriteFile(path, []byte(strings.Join(stages, "\n---\n")), 0o644)
}

// podEndStage ends a Running pod whose phaseAnnotation says phase: every container terminated
// with the exit code.
func podEndStage(phase string, exitCode int, reason string) string {
	return fmt.Sprintf(`apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpualloc-pod-%[1]s
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["%[4]s"]'
      operator: 'In'
      values: ['%[1]s']
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $started := or .status.startTime $now }}
      conditions:
      - lastTransitionTime: {{ $started | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: Ready
        reason: PodCompleted
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: ContainersReady
        reason: PodCompleted
      - lastTransitionTime: {{ $started | Quote }}
        status: "True"
        type: PodScheduled
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: %[2]d
            reason: %[3]s
            startedAt: {{ $started | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: %[1]s
`, phase, exitCode, reason, phaseAnnotation)
}

// up starts `run` in the background (its own session, output in DIR/controlplane.log) and
// returns once it is ready.
func up(args []string) int {
	o, err := parseRunFlags("up", args)
	if err != nil {
		return 2
	}
	if pid, alive := runningPid(o.dir); alive {
		if _, err := os.Stat(filepath.Join(o.dir, readyFile)); err == nil {
			fmt.Printf("already up (pid %d): KUBECONFIG=%s\n", pid, filepath.Join(o.dir, kubeconfigFile))
			return 0
		}
		return fail(fmt.Errorf("a control plane (pid %d) is starting or failing in %s; `controlplane down` stops it", pid, o.dir))
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fail(err)
	}
	log, err := os.Create(filepath.Join(o.dir, logFile))
	if err != nil {
		return fail(err)
	}
	defer log.Close()
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(self, "run", "--dir="+o.dir, "--fleet="+o.fleet, "--timeout="+o.timeout.String())
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(o.timeout + 30*time.Second)
	for {
		if _, err := os.Stat(filepath.Join(o.dir, readyFile)); err == nil {
			fmt.Printf("control plane up (pid %d), logs in %s\n  export KUBECONFIG=%s\n",
				cmd.Process.Pid, o.dir, filepath.Join(o.dir, kubeconfigFile))
			return 0
		}
		select {
		case err := <-exited:
			tail, _ := os.ReadFile(filepath.Join(o.dir, logFile))
			return fail(fmt.Errorf("it ended before it was ready (%v):\n%s", err, tail))
		case <-deadline:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			return fail(fmt.Errorf("not ready in time; see %s", filepath.Join(o.dir, logFile)))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// down stops the `run` recorded in DIR/controlplane.pid and waits until it and its children are gone.
func down(args []string) int {
	o, err := parseRunFlags("down", args)
	if err != nil {
		return 2
	}
	pid, alive := runningPid(o.dir)
	if !alive {
		fmt.Println("no control plane running in", o.dir)
		return 0
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			fmt.Println("control plane stopped")
			return 0
		}
	}
	// Its children die with it (parent-death signal).
	_ = syscall.Kill(pid, syscall.SIGKILL)
	fmt.Println("control plane killed after 60 s")
	return 0
}

// runningPid reads DIR/controlplane.pid; alive says whether that process is a `controlplane run`.
func runningPid(dir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return pid, false
	}
	parts := strings.Split(string(cmdline), "\x00")
	return pid, len(parts) > 1 && parts[1] == "run"
}
