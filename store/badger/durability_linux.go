package badger

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// syncActive syncs the newest WAL and value-log file through descriptors of its own, both at
// once, without Badger's lock. On Linux a file's pages are one page cache however they were
// written: fdatasync on any descriptor writes back the pages Badger dirtied through its mapping,
// as the msync of db.Sync would (msync(MS_SYNC) is a ranged fdatasync there).
func (d *durableSync) syncActive(paths []string) error {
	errs := make(chan error, len(paths))
	for _, p := range paths {
		go func() { errs <- d.datasync(p) }()
	}
	var all []error
	for range paths {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// datasyncFile is durableSync's default datasync.
func datasyncFile(path string) error {
	return syncPath(path, func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) })
}
