package main

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// kwok manages the nodes that carry this annotation with the value "fake".
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

// A node of the fleet file (examples/fleets/k8s-demo.yaml): what its kubelet, NVIDIA's GPU
// Feature Discovery and device plugin would have put on the Node object.
type fleetNode struct {
	Name      string            `json:"name"`
	CPUMilli  int64             `json:"cpu_milli"`
	MemoryMiB int64             `json:"memory_mib"`
	Pods      int64             `json:"pods"`
	Labels    map[string]string `json:"labels"`
	Resources map[string]string `json:"resources"` // extended resources: allocatable = capacity
	Taints    []corev1.Taint    `json:"taints"`
}

type fleetFile struct {
	Nodes []fleetNode `json:"nodes"`
}

func readFleet(path string) ([]fleetNode, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var fleet fleetFile
	if err := yaml.UnmarshalStrict(data, &fleet); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	seen := map[string]bool{}
	for _, n := range fleet.Nodes {
		if n.Name == "" || seen[n.Name] {
			return nil, fmt.Errorf("%s: every node needs a name of its own (%q)", path, n.Name)
		}
		seen[n.Name] = true
	}
	return fleet.Nodes, nil
}

// nodeObject is the Node the API server gets: the kubelet's usual labels, kwok's annotation, and
// capacity = allocatable, as kwok's node-initialize stage keeps them.
func nodeObject(n fleetNode) (*corev1.Node, error) {
	labels := map[string]string{
		"kubernetes.io/hostname": n.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		"type":                   "kwok",
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	pods := n.Pods
	if pods == 0 {
		pods = 110
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewMilliQuantity(n.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(n.MemoryMiB<<20, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(pods, resource.DecimalSI),
		corev1.ResourceEphemeralStorage: resource.MustParse("500Gi"),
	}
	for name, value := range n.Resources {
		quantity, err := resource.ParseQuantity(value)
		if err != nil {
			return nil, fmt.Errorf("node %s: resource %s: %w", n.Name, name, err)
		}
		resources[corev1.ResourceName(name)] = quantity
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			Labels: labels,
			Annotations: map[string]string{
				kwokNodeAnnotation:             "fake",
				"node.alpha.kubernetes.io/ttl": "0",
			},
		},
		Spec: corev1.NodeSpec{Taints: n.Taints},
		Status: corev1.NodeStatus{
			Capacity:    resources,
			Allocatable: resources.DeepCopy(),
			NodeInfo:    corev1.NodeSystemInfo{Architecture: "amd64", OperatingSystem: "linux"},
		},
	}, nil
}

// createNodes creates the fleet's nodes (replacing any of the same name) and returns their names.
func createNodes(ctx context.Context, clients *kubernetes.Clientset, path string) ([]string, error) {
	fleet, err := readFleet(path)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(fleet))
	for _, n := range fleet {
		node, err := nodeObject(n)
		if err != nil {
			return nil, err
		}
		err = clients.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		// The status comes with the object on create, as a kubelet registers its node.
		if _, err := clients.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		names = append(names, n.Name)
	}
	return names, nil
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
