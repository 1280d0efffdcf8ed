// Command controlplane is a local Kubernetes control plane for jupyter-gpualloc's tests and demo:
// one binary holding etcd (embedded), kube-apiserver, kube-scheduler, kube-controller-manager and
// kwok, all from their Go modules at one Kubernetes release (go.mod), each component run as its
// own process by `controlplane run`, which also creates GPU nodes from a fleet file. See
// docs/kubernetes.md.
//
//	controlplane up   --dir .k8s [--fleet FILE]   start in the background, wait until ready, return
//	controlplane down --dir .k8s                  stop what `up` started
//	controlplane run  --dir DIR  [--fleet FILE]   the same in the foreground, until SIGTERM/SIGINT
//	                                              (SIGUSR1 stops kube-apiserver alone, SIGUSR2 starts it again)
//
// The components themselves (used by `run`; the upstream commands and flags):
//
//	controlplane kube-apiserver|kube-scheduler|kube-controller-manager|kwok FLAGS...
//
// etcd runs embedded in the `run` process.
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: controlplane up|down|run|kube-apiserver|kube-scheduler|kube-controller-manager|kwok ...")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	// The upstream commands read their flags from os.Args[1:].
	os.Args = append([]string{name}, args...)
	switch name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kwok":
		os.Exit(runKwok())
	case "up":
		os.Exit(up(args))
	case "down":
		os.Exit(down(args))
	case "run":
		os.Exit(run(args))
	default:
		fmt.Fprintf(os.Stderr, "controlplane: unknown command %q\n", name)
		os.Exit(2)
	}
}
