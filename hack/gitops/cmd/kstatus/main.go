// Command kstatus prints kstatus's reading (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute,
// the library behind Flux's health checks, kpt and cli-utils) of Kubernetes objects: it reads one
// JSON object per line on stdin and prints, for each, one line `STATUS<TAB>MESSAGE`.
//
// tests/gitops.rs pipes in every version of the ManagedJobs a watch saw, to measure how long a
// new job reads as Current before its first status.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 16<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	line := 0
	for in.Scan() {
		line++
		if strings.TrimSpace(in.Text()) == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(in.Bytes()); err != nil {
			fmt.Fprintf(os.Stderr, "line %d: %v\n", line, err)
			os.Exit(1)
		}
		res, err := status.Compute(u)
		if err != nil {
			fmt.Fprintf(out, "Error\t%s\n", oneLine(err.Error()))
			continue
		}
		fmt.Fprintf(out, "%s\t%s\n", res.Status, oneLine(res.Message))
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
