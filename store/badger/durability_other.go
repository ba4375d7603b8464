//go:build !linux

package badger

// syncActive syncs the newest WAL and value-log file with Badger's own db.Sync: elsewhere a
// descriptor of our own is not known to write back pages written through Badger's mapping.
func (d *durableSync) syncActive([]string) error { return d.db.Sync() }

// datasyncFile is unused where syncActive is db.Sync; it stays a whole-file sync.
var datasyncFile = fsyncFile
