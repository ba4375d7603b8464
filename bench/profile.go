package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// profileRate is MULLIGAN_PROFILE_RATE for the gateways of a -profile run: one blocking event
// sampled per microsecond blocked, one mutex contention in 1000 (the sidecar's profileRates).
const profileRate = "1000"

// profiledKinds are the profiles -profile takes of each Mulligan gateway, from Caddy's admin
// API: CPU, and the block and mutex profiles' deltas over the same seconds.
var profiledKinds = []string{"profile", "block", "mutex"}

// profileEnv is what a gateway's environment gains in a -profile run.
func (h *harness) profileEnv() []string {
	if h.cfg.ProfileDir == "" {
		return nil
	}
	return []string{"MULLIGAN_PROFILE_RATE=" + profileRate}
}

// startProfiles begins profiling gateway g for the first round of scenario when -profile is
// set: CPU, block and mutex profiles over the round's length (Duration; an end-to-end round
// is profiled for its first Duration). The returned function waits for them and writes them to
// ProfileDir/<scenario>.<gateway>.<kind>.pprof.
func (h *harness) startProfiles(ctx context.Context, scenario string, round int, g *gateway) func() {
	if h.cfg.ProfileDir == "" || round != 0 || g == h.plain || g.admin == "" {
		return func() {}
	}
	seconds := max(1, int(h.cfg.Duration/time.Second))
	var wg sync.WaitGroup
	for _, kind := range profiledKinds {
		wg.Go(func() {
			name := fmt.Sprintf("%s.%s.%s.pprof", strings.ReplaceAll(scenario, " ", "-"), g.name, strings.Replace(kind, "profile", "cpu", 1))
			if err := fetchProfile(ctx, fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", g.admin, kind, seconds), filepath.Join(h.cfg.ProfileDir, name)); err != nil {
				h.logf("profile %s: %v", name, err)
			}
		})
	}
	return wg.Wait
}

// fetchProfile writes the profile at url to path.
func fetchProfile(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
