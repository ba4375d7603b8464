package badger

import (
	"os"

	"golang.org/x/sys/unix"
)

// ownDescriptors: the newest WAL and value log are synced through descriptors of this process,
// without Badger's lock. On Linux a file's pages are one page cache however they were written:
// fdatasync on any descriptor writes back the pages Badger dirtied through its mapping, as the
// msync of db.Sync would (msync(MS_SYNC) is a ranged fdatasync there).
const ownDescriptors = true

// datasyncFile is durableSync's default datasync.
func datasyncFile(path string) error {
	return syncPath(path, func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) })
}
