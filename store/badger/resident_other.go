//go:build !linux

package badger

import "errors"

// mappedFiles is Linux's alone (/proc/self/smaps): elsewhere no value log is paged out.
func mappedFiles(string) ([]mapping, error) { return nil, nil }

func pageOut(mapping) error { return errors.ErrUnsupported }

func residentBytes() (int64, error) { return 0, errors.ErrUnsupported }
