package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// residentKinds are the parts of a gateway's resident set the batch scenario tells apart, by
// what each mapping maps: the heap and stacks (anonymous), the binary, and Badger's files (its
// memtables' logs, tables and value logs).
var residentKinds = []string{"anon", "binary", ".mem", ".sst", ".vlog", "other"}

// residentByKind reads /proc/<pid>/smaps of the gateway and sums each mapping's Rss by kind.
func (g *gateway) residentByKind() (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", g.Pid()))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", g.Pid()))
	out := map[string]int64{}
	kind := "other"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rss, ok := strings.CutPrefix(line, "Rss:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rss), "kB")), 10, 64)
			out[kind] += kb << 10
			continue
		}
		if fields := strings.Fields(line); len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			kind = mappingKind(fields, exe)
		}
	}
	return out, sc.Err()
}

// mappingKind is the residentKinds entry of the smaps header line split into fields.
func mappingKind(fields []string, exe string) string {
	if len(fields) < 6 || strings.HasPrefix(fields[5], "[") {
		return "anon" // [heap], [stack], or no file at all
	}
	path := strings.Join(fields[5:], " ")
	switch ext := filepath.Ext(path); {
	case path == exe:
		return "binary"
	case slices.Contains(residentKinds, ext):
		return ext
	}
	return "other"
}

// formatKinds lists a residentByKind breakdown in residentKinds' order, the empty kinds left out.
func formatKinds(kinds map[string]int64) string {
	var parts []string
	for _, k := range residentKinds {
		if kinds[k] > 0 {
			parts = append(parts, k+" "+mib(kinds[k]))
		}
	}
	return strings.Join(parts, ", ")
}
