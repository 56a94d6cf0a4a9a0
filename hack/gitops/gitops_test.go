package gitops

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

const (
	samplesDir = "../../examples/gitops/samples"
	luaScript  = "../../examples/gitops/argocd-health.lua"
)

// verdict is what each tool must make of one sample.
type verdict struct {
	argo    string
	kstatus status.Status
}

// want holds every sample file, by name: a new sample (e.g. a new phase) fails the tests until
// its verdicts are added here.
var want = map[string]verdict{
	// A job is in progress until it finishes (issue 24): a GitOps tool that waits for it waits
	// for its outcome, as Argo CD does for a batch/v1 Job.
	"Pending.yaml":    {"Progressing", status.InProgressStatus},
	"Submitted.yaml":  {"Progressing", status.InProgressStatus},
	"Starting.yaml":   {"Progressing", status.InProgressStatus},
	"Running.yaml":    {"Progressing", status.InProgressStatus},
	"Recovering.yaml": {"Progressing", status.InProgressStatus},
	"Cancelling.yaml": {"Progressing", status.InProgressStatus},
	// Held by spec.suspend, as its spec asks: Argo CD's own Suspended health (as for a suspended
	// CronJob), and Current to kstatus, so a GitOps tool waiting for its objects is not held.
	"Suspended.yaml": {"Suspended", status.CurrentStatus},

	"Succeeded.yaml": {"Healthy", status.CurrentStatus},
	// Cancelled as its spec asks (spec.cancel: true): the object is what git says it should be.
	"Cancelled.yaml": {"Healthy", status.CurrentStatus},
	// spec.cancel set back to false after it finished: git asks for a run that will not happen.
	"Cancelled-cancel-reverted.yaml": {"Degraded", status.FailedStatus},

	"Running-pipeline-task-2-of-3.yaml": {"Progressing", status.InProgressStatus},
	"Starting-pipeline-next-task.yaml":  {"Progressing", status.InProgressStatus},
	"Succeeded-pipeline.yaml":           {"Healthy", status.CurrentStatus},
	"Failed-pipeline-task-skipped.yaml": {"Degraded", status.FailedStatus},

	"Failed.yaml":           {"Degraded", status.FailedStatus},
	"FailedSetup.yaml":      {"Degraded", status.FailedStatus},
	"FailedPrecheck.yaml":   {"Degraded", status.FailedStatus},
	"FailedNoResource.yaml": {"Degraded", status.FailedStatus},
	"FailedController.yaml": {"Degraded", status.FailedStatus},

	// The user changed spec (generation 2); the status still describes generation 1.
	"Running-generation-not-observed.yaml": {"Progressing", status.InProgressStatus},
	// No operator has written a status: the API serves the CRD's default status
	// {observedGeneration: 0}, which kstatus reads as InProgress (LatestGenerationNotObserved).
	"New.yaml": {"Progressing", status.InProgressStatus},
	// The same object without that default (a CRD older than it): kstatus reads an object
	// without observedGeneration and conditions as Current ("Resource is current"): the gap
	// the default closes. The Lua check says Progressing either way.
	"New-without-status-default.yaml": {"Progressing", status.CurrentStatus},
}

type sample struct {
	name string
	obj  *unstructured.Unstructured
}

// load reads every sample as the API server would hand it to a client: YAML to JSON, then
// decoded by apimachinery (integers as int64, which kstatus requires).
func load(t *testing.T) []sample {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no samples in %s: run `MJ_UPDATE_SAMPLES=1 cargo test --test gitops`", samplesDir)
	}
	var out []sample
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, sample{filepath.Base(path), u})
	}
	return out
}

func TestEverySampleHasAVerdict(t *testing.T) {
	var have []string
	for _, s := range load(t) {
		have = append(have, s.name)
		if _, ok := want[s.name]; !ok {
			t.Errorf("%s has no expected verdicts in gitops_test.go", s.name)
		}
		phase, found, _ := unstructured.NestedString(s.obj.Object, "status", "phase")
		if found && !strings.HasPrefix(s.name, phase+".") && !strings.HasPrefix(s.name, phase+"-") {
			t.Errorf("%s holds phase %s", s.name, phase)
		}
	}
	sort.Strings(have)
	for name := range want {
		if i := sort.SearchStrings(have, name); i == len(have) || have[i] != name {
			t.Errorf("sample %s is missing: run `MJ_UPDATE_SAMPLES=1 cargo test --test gitops`", name)
		}
	}
}

func readScript(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile(luaScript)
	if err != nil {
		t.Fatal(err)
	}
	return string(script)
}

func TestArgoCDHealth(t *testing.T) {
	script := readScript(t)
	for _, s := range load(t) {
		t.Run(s.name, func(t *testing.T) {
			h, err := ArgoHealth(s.obj.Object, script)
			if err != nil {
				t.Fatalf("the health check failed: %v", err)
			}
			t.Logf("%-40s Argo CD %-11s %q", s.name, h.Status, h.Message)
			if w := want[s.name].argo; h.Status != w {
				t.Errorf("Argo CD health %s (%q), want %s", h.Status, h.Message, w)
			}
			phase, found, _ := unstructured.NestedString(s.obj.Object, "status", "phase")
			switch {
			case !found:
				if h.Message != "Waiting for the operator" {
					t.Errorf("message %q, want %q", h.Message, "Waiting for the operator")
				}
			case s.name == "Running-generation-not-observed.yaml":
				if h.Message != "Waiting for the operator to observe generation 2" {
					t.Errorf("message %q", h.Message)
				}
			default:
				// The phase, then the message of the condition that decided (the job's own).
				msg := deciding(t, s.obj)
				if !strings.HasPrefix(h.Message, phase) || !strings.HasSuffix(h.Message, msg) {
					t.Errorf("message %q should name the phase %s and end with the condition's message %q", h.Message, phase, msg)
				}
			}
		})
	}
}

// deciding is the message of the condition kstatus decides by: the first True Reconciling or
// Stalled, else Ready.
func deciding(t *testing.T, obj *unstructured.Unstructured) string {
	t.Helper()
	conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	ready := ""
	for _, c := range conditions {
		m := c.(map[string]interface{})
		if m["status"] == "True" && (m["type"] == "Reconciling" || m["type"] == "Stalled") {
			return m["message"].(string)
		}
		if m["type"] == "Ready" {
			ready, _ = m["message"].(string)
		}
	}
	return ready
}

// A phase the script does not know (a newer operator) changes nothing: the verdict comes from
// the conditions.
func TestArgoCDHealthOfAnUnknownPhaseFollowsTheConditions(t *testing.T) {
	script := readScript(t)
	cases := map[string]string{
		"Pending.yaml":   "Progressing",
		"Running.yaml":   "Progressing",
		"Succeeded.yaml": "Healthy",

		"Running-pipeline-task-2-of-3.yaml": "Progressing",
		"Failed.yaml":                       "Degraded",
		"Cancelled.yaml":                    "Healthy",
		"Cancelled-cancel-reverted.yaml":    "Degraded",
	}
	for _, s := range load(t) {
		wantStatus, ok := cases[s.name]
		if !ok {
			continue
		}
		obj := s.obj.DeepCopy()
		if err := unstructured.SetNestedField(obj.Object, "SomeFuturePhase", "status", "phase"); err != nil {
			t.Fatal(err)
		}
		h, err := ArgoHealth(obj.Object, script)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if h.Status != wantStatus {
			t.Errorf("%s with an unknown phase: %s, want %s", s.name, h.Status, wantStatus)
		}
	}
}

// Argo CD and kstatus agree on every sample that has a status: Progressing is InProgress,
// Healthy Current, Degraded Failed.
func TestArgoCDAndKstatusAgree(t *testing.T) {
	script := readScript(t)
	same := map[string]status.Status{
		"Progressing": status.InProgressStatus,
		"Healthy":     status.CurrentStatus,
		"Degraded":    status.FailedStatus,
		// Argo CD's own word for an object held as its spec asks; kstatus has none: Current.
		"Suspended": status.CurrentStatus,
	}
	for _, s := range load(t) {
		if _, found, _ := unstructured.NestedMap(s.obj.Object, "status"); !found {
			continue // the gap the status default closes: see New-without-status-default.yaml
		}
		h, err := ArgoHealth(s.obj.Object, script)
		if err != nil {
			t.Fatal(err)
		}
		res, err := status.Compute(s.obj)
		if err != nil {
			t.Fatal(err)
		}
		if same[h.Status] != res.Status {
			t.Errorf("%s: Argo CD %s, kstatus %s", s.name, h.Status, res.Status)
		}
	}
}

func TestKstatus(t *testing.T) {
	for _, s := range load(t) {
		t.Run(s.name, func(t *testing.T) {
			res, err := status.Compute(s.obj)
			if err != nil {
				t.Fatalf("kstatus: %v", err)
			}
			t.Logf("%-40s kstatus %-10s %q", s.name, res.Status, res.Message)
			if w := want[s.name].kstatus; res.Status != w {
				t.Errorf("kstatus %s (%q), want %s", res.Status, res.Message, w)
			}
		})
	}
}
