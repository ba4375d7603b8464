package responses

import "github.com/mulligan-gw/mulligan/internal/sse"

// sseSplit cuts a body into events as the gateway does.
type sseSplit struct{ s sse.Splitter }

func (x *sseSplit) each(body []byte, fn func([]byte)) { x.s.Push(body, fn) }
