// Package rdmalab holds what the RDMA lab's tests read of the kernel (see
// docs/RDMA-LAB.md), for the tests of the verbs binding and of the verbs
// transport alike.
package rdmalab

import (
	"encoding/json"
	"fmt"
	"os/exec"
)

// Resources counts the verbs objects the kernel holds per device (PDs,
// CQs, QPs, MRs, contexts), as iproute2's `rdma resource show` lists them:
// what a leak would leave behind.
func Resources() (map[string]map[string]int, error) {
	out, err := exec.Command("rdma", "-j", "resource", "show").Output()
	if err != nil {
		return nil, fmt.Errorf("rdma -j resource show: %w", err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out, &rows); err != nil {
		return nil, fmt.Errorf("rdma -j resource show: %w: %s", err, out)
	}
	m := map[string]map[string]int{}
	for _, r := range rows {
		name, _ := r["ifname"].(string)
		counts := map[string]int{}
		for _, k := range []string{"pd", "cq", "qp", "mr", "ctx"} {
			v, _ := r[k].(float64)
			counts[k] = int(v)
		}
		m[name] = counts
	}
	return m, nil
}
