// Command karpenter-repair prints what Karpenter's node repair decides for Nodes, with Karpenter's
// own code: the AWS provider's RepairPolicies() (github.com/aws/karpenter-provider-aws
// pkg/cloudprovider) judged by core Karpenter's matcher (sigs.k8s.io/karpenter
// pkg/controllers/node/health: NewRepairPolicyMatcher, Match, Resolve), or, with --legacy, the
// provider's legacy policies judged by the legacy controller (pkg/controllers/node/legacyrepair),
// run against a fake API client holding the Node and its NodeClaim.
//
// It reads a Node, or a v1 List of Nodes (kubectl get nodes -o json), on standard input and writes
// one JSON line per node condition a policy covers, then one with the node's resolved decision:
//
//	{"node":"n","condition":"AcceleratedHardwareReady","status":"False","reason":"NvidiaXID79Error",
//	 "action":"ReplaceNode","fallback":false,"reasonRegex":".*XID(64|74|79|119|120).*",
//	 "lastTransitionTime":"…","eligibleAt":"…","tolerationSeconds":600,"eligibleNow":false}
//
// A decision for a condition no policy covers is not printed. The program judges; it changes nothing.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	awscloudprovider "github.com/aws/karpenter-provider-aws/pkg/cloudprovider"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	clock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	"sigs.k8s.io/karpenter/pkg/controllers/node/legacyrepair"
	"sigs.k8s.io/karpenter/pkg/events"
	"sigs.k8s.io/karpenter/pkg/operator/options"
)

// decision is one output line: a condition's, or with Resolved the node's merged decision as of --now.
type decision struct {
	Node      string `json:"node"`
	Resolved  bool   `json:"resolved,omitempty"`
	Condition string `json:"condition,omitempty"`
	Status    string `json:"status,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Action    string `json:"action,omitempty"`
	// Karpenter's catch-all policy decided (a reason no specific policy matches); never with --legacy.
	Fallback           bool         `json:"fallback"`
	ReasonRegex        string       `json:"reasonRegex,omitempty"`
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	EligibleAt         *metav1.Time `json:"eligibleAt,omitempty"`
	TolerationSeconds  *float64     `json:"tolerationSeconds,omitempty"`
	EligibleNow        bool         `json:"eligibleNow"`
}

func main() {
	legacy := flag.Bool("legacy", false, "judge with the provider's legacy policies and Karpenter's legacy node repair controller (--legacy-node-repair), as Karpenter 1.14 did")
	reboot := flag.Bool("reboot-for-repair", false, "the provider's RebootForRepair feature gate: reboot-clearable faults reboot the node instead of replacing it")
	nowFlag := flag.String("now", "", "the instant to resolve at, RFC 3339 (default: the present)")
	flag.Parse()
	now := time.Now()
	if *nowFlag != "" {
		parsed, err := time.Parse(time.RFC3339, *nowFlag)
		if err != nil {
			fail(fmt.Errorf("--now %q is not an RFC 3339 time: %w", *nowFlag, err))
		}
		now = parsed
	}
	nodes, err := readNodes(os.Stdin)
	if err != nil {
		fail(err)
	}
	// Only RepairPolicies() is called, which reads nothing but the two options.
	provider := awscloudprovider.New(nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
		awscloudprovider.WithLegacyRepairPolicies(*legacy), awscloudprovider.WithRebootForRepair(*reboot))
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	encoder := json.NewEncoder(out)
	judge := current
	if *legacy {
		judge = legacyJudge
	}
	for i := range nodes {
		lines, err := judge(provider, &nodes[i], now)
		if err != nil {
			fail(fmt.Errorf("node %s: %w", nodes[i].Name, err))
		}
		for _, line := range lines {
			if err := encoder.Encode(line); err != nil {
				fail(err)
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "karpenter-repair: %v\n", err)
	os.Exit(2)
}

// readNodes accepts one Node or a List of them, refusing anything else by name.
func readNodes(r io.Reader) ([]corev1.Node, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading standard input: %w", err)
	}
	var kind struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(raw, &kind); err != nil {
		return nil, fmt.Errorf("standard input is not JSON: %w", err)
	}
	switch kind.Kind {
	case "Node":
		var node corev1.Node
		if err := json.Unmarshal(raw, &node); err != nil {
			return nil, fmt.Errorf("standard input is not a Node: %w", err)
		}
		return []corev1.Node{node}, nil
	case "List", "NodeList":
		var list corev1.NodeList
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("standard input is not a list of Nodes: %w", err)
		}
		return list.Items, nil
	default:
		return nil, fmt.Errorf("standard input is a %q, not a Node or a List of Nodes", kind.Kind)
	}
}

// current judges with node repair as a disruption method (Karpenter 1.15's default with NodeRepair=true).
func current(provider cloudprovider.CloudProvider, node *corev1.Node, now time.Time) ([]decision, error) {
	ctx := options.ToContext(context.Background(), &options.Options{FeatureGates: options.FeatureGates{NodeRepair: true}})
	matcher, err := health.NewRepairPolicyMatcher(ctx, provider)
	if err != nil {
		return nil, err
	}
	if matcher == nil {
		return nil, errors.New("node repair is off: Karpenter returned no matcher")
	}
	matches := matcher.Match(node)
	var lines []decision
	for _, match := range matches {
		// The match's fields are Karpenter's own, read through its structured-log view.
		values := logValues(match.LogValues())
		eligibleAt := values["eligible-at"].(time.Time)
		condition := conditionOf(node, fmt.Sprint(values["condition"]))
		line := decision{
			Node:        node.Name,
			Condition:   fmt.Sprint(values["condition"]),
			Status:      fmt.Sprint(values["status"]),
			Reason:      fmt.Sprint(values["reason"]),
			Action:      fmt.Sprint(values["action"]),
			Fallback:    values["fallback"].(bool),
			ReasonRegex: fmt.Sprint(values["reason-regex"]),
			EligibleAt:  &metav1.Time{Time: eligibleAt},
			EligibleNow: !eligibleAt.After(now),
		}
		withTransition(&line, condition, node)
		lines = append(lines, line)
	}
	resolved := health.Resolve(matches, now, time.Time{})
	line := decision{Node: node.Name, Resolved: true}
	if resolved.Action != "" {
		line.Condition = string(resolved.Condition)
		line.Status = string(resolved.ConditionStatus)
		line.Reason = resolved.Reason
		line.Action = string(resolved.Action)
		line.Fallback = resolved.Fallback
		line.ReasonRegex = resolved.ReasonRegex
		line.EligibleAt = &metav1.Time{Time: resolved.SelectedEligibleAt}
		line.EligibleNow = true
	}
	return append(lines, line), nil
}

// legacyJudge runs the legacy controller's Reconcile once per condition, on a copy of the node that
// holds only that condition: a NodeClaim deleted means the repair is due now, a requeue says when
// it will be; neither means no policy covers the condition.
func legacyJudge(provider cloudprovider.CloudProvider, node *corev1.Node, now time.Time) ([]decision, error) {
	var lines []decision
	for _, condition := range node.Status.Conditions {
		alone := node.DeepCopy()
		alone.Status.Conditions = []corev1.NodeCondition{condition}
		if alone.Spec.ProviderID == "" {
			alone.Spec.ProviderID = "aws:///us-west-2a/i-" + node.Name
		}
		claim := &karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: node.Name},
			Status:     karpv1.NodeClaimStatus{ProviderID: alone.Spec.ProviderID, NodeName: node.Name},
		}
		kube := fake.NewClientBuilder().WithScheme(scheme.Scheme).
			WithObjects(alone, claim).
			WithIndex(&karpv1.NodeClaim{}, "status.providerID", func(o client.Object) []string {
				return []string{o.(*karpv1.NodeClaim).Status.ProviderID}
			}).
			WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string {
				return []string{o.(*corev1.Pod).Spec.NodeName}
			}).
			Build()
		controller := legacyrepair.NewController(kube, provider, clock.NewFakeClock(now), events.NewRecorder(record.NewFakeRecorder(16)))
		ctx := log.IntoContext(context.Background(), zap.New(zap.WriteTo(io.Discard)))
		result, err := controller.Reconcile(ctx, alone)
		if err != nil {
			return nil, fmt.Errorf("the legacy controller failed on %s: %w", condition.Type, err)
		}
		gone := kube.Get(ctx, client.ObjectKeyFromObject(claim), &karpv1.NodeClaim{}) != nil
		if !gone && result.RequeueAfter == 0 {
			continue
		}
		// The legacy controller reads no reason: every policy is a condition type and status.
		line := decision{
			Node:        node.Name,
			Condition:   string(condition.Type),
			Status:      string(condition.Status),
			Reason:      condition.Reason,
			Action:      string(cloudprovider.ReplaceNode),
			EligibleNow: gone,
			EligibleAt:  &metav1.Time{Time: now.Add(result.RequeueAfter)},
		}
		if gone {
			// Due already: the requeue no longer says since when; the policy's toleration does.
			toleration, err := legacyToleration(provider, condition)
			if err != nil {
				return nil, err
			}
			line.EligibleAt = &metav1.Time{Time: condition.LastTransitionTime.Add(toleration)}
		}
		withTransition(&line, &condition, node)
		lines = append(lines, line)
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].Condition < lines[j].Condition })
	return lines, nil
}

// legacyToleration is the legacy policy's toleration for a condition already due.
func legacyToleration(provider cloudprovider.CloudProvider, condition corev1.NodeCondition) (time.Duration, error) {
	for _, policy := range provider.RepairPolicies() {
		if policy.ConditionType == condition.Type && policy.ConditionStatus == condition.Status {
			return policy.TolerationDuration, nil
		}
	}
	return 0, fmt.Errorf("the legacy controller repaired %s=%s, which no legacy policy covers", condition.Type, condition.Status)
}

// withTransition adds the condition's transition time and, where the repair is still to come, the
// toleration counted from it.
func withTransition(line *decision, condition *corev1.NodeCondition, node *corev1.Node) {
	if condition == nil || condition.LastTransitionTime.IsZero() {
		return
	}
	transition := condition.LastTransitionTime.Time
	line.LastTransitionTime = &metav1.Time{Time: transition}
	if line.EligibleAt != nil && !transition.Before(node.CreationTimestamp.Time) {
		seconds := line.EligibleAt.Sub(transition).Seconds()
		line.TolerationSeconds = &seconds
	}
}

func conditionOf(node *corev1.Node, conditionType string) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if string(node.Status.Conditions[i].Type) == conditionType {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

func logValues(pairs []any) map[string]any {
	values := map[string]any{}
	for i := 0; i+1 < len(pairs); i += 2 {
		values[fmt.Sprint(pairs[i])] = pairs[i+1]
	}
	return values
}
