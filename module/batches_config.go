package module

import (
	"fmt"
	"strings"

	"github.com/mulligan-gw/mulligan/internal/batches"
)

// Defaults of the batches block (docs/caddyfile.md): OpenAI's own limits.
const (
	defaultMaxFileSize = 200 << 20
	defaultMaxRequests = 50000
	// A scope's stored files together: five uploads of the largest size, a hundred files.
	defaultMaxScopeBytes = 1 << 30
	defaultMaxScopeFiles = 100
)

// BatchesConfig serves the OpenAI Files and Batches API (docs/batches.md).
type BatchesConfig struct {
	// Prefix is where the API is served: {prefix}/files and {prefix}/batches. Example: /v1.
	Prefix string `json:"prefix,omitempty"`
	// MaxFileSize is the largest file accepted, in bytes. Default: 200 MiB.
	MaxFileSize int64 `json:"max_file_size,omitempty"`
	// MaxRequests is the most lines a batch's input file may have. Default: 50,000.
	MaxRequests int `json:"max_requests,omitempty"`
	// MaxScopeBytes bounds the bytes of one scope's stored files together (uploads in progress
	// included, until they expire or are deleted), so that no caller can fill the disk; an
	// upload that would go over it is refused with 400 FILE_QUOTA_EXCEEDED and leaves nothing
	// stored. A batch's output and error files do not count: they are not stored files.
	// Default: 1 GiB.
	MaxScopeBytes int64 `json:"max_scope_bytes,omitempty"`
	// MaxScopeFiles bounds how many files one scope stores at once. Default: 100.
	MaxScopeFiles int `json:"max_scope_files,omitempty"`
}

func (c *BatchesConfig) setDefaults() {
	if c == nil {
		return
	}
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	if c.MaxFileSize == 0 {
		c.MaxFileSize = defaultMaxFileSize
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = defaultMaxRequests
	}
	if c.MaxScopeBytes == 0 {
		c.MaxScopeBytes = defaultMaxScopeBytes
	}
	if c.MaxScopeFiles == 0 {
		c.MaxScopeFiles = defaultMaxScopeFiles
	}
}

// api is c as the API's settings.
func (c *BatchesConfig) api() batches.Config { return batches.Config(*c) }

func (c *BatchesConfig) validate() error {
	if c == nil {
		return nil
	}
	switch {
	case !strings.HasPrefix(c.Prefix, "/") || strings.ContainsAny(c.Prefix, "*?#{} "):
		return fmt.Errorf("batches must name a plain path prefix such as /v1, got %q", c.Prefix)
	case c.MaxFileSize < 0 || c.MaxRequests < 0:
		return fmt.Errorf("batches: max_file_size and max_requests must be positive")
	case c.MaxScopeBytes < 0 || c.MaxScopeFiles < 0:
		return fmt.Errorf("batches: max_scope_bytes and max_scope_files must be positive")
	}
	return nil
}

// covers reports whether path belongs to the Files or Batches API.
func (c *BatchesConfig) covers(path string) bool {
	if c == nil {
		return false
	}
	api := c.api()
	return api.Covers(path)
}
