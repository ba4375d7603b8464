package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// errNoGateway means polling is off because Config.Gateway is empty.
var errNoGateway = errors.New("no gateway configured to poll")

// fetchOperation returns the operation's current state from the gateway:
// GET {Gateway}{links.self}, with Config.PollHeader.
func (c *Consumer) fetchOperation(ctx context.Context, op Operation) (Operation, error) {
	url, err := c.operationURL(op)
	if err != nil {
		return Operation{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Operation{}, err
	}
	req.Header = c.cfg.PollHeader.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		return Operation{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Operation{}, fmt.Errorf("GET %s: gateway answered %s", op.Links.Self, resp.Status)
	}
	var fresh Operation
	if err := json.NewDecoder(io.LimitReader(resp.Body, c.cfg.MaxBodyBytes)).Decode(&fresh); err != nil {
		return Operation{}, fmt.Errorf("GET %s: %w", op.Links.Self, err)
	}
	if fresh.OperationID != op.OperationID {
		return Operation{}, fmt.Errorf("GET %s: gateway answered operation %q", op.Links.Self, fresh.OperationID)
	}
	return fresh, nil
}

// operationURL joins the gateway's origin and links.self, which must be a
// path: an event may name its operation, not send the consumer elsewhere.
func (c *Consumer) operationURL(op Operation) (string, error) {
	if c.cfg.Gateway == "" {
		return "", errNoGateway
	}
	self := op.Links.Self
	if !strings.HasPrefix(self, "/") || strings.HasPrefix(self, "//") {
		return "", fmt.Errorf("operation links.self %q is not a path on the gateway", self)
	}
	return strings.TrimSuffix(c.cfg.Gateway, "/") + self, nil
}
