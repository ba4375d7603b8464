//go:build !linux

package badger

// ownDescriptors: elsewhere a descriptor of this process is not known to write back pages
// written through Badger's mapping, so the newest WAL and value log are synced by Badger's own
// db.Sync, holding its lock.
const ownDescriptors = false

// datasyncFile is unused where the newest files are synced by db.Sync.
var datasyncFile = fsyncFile
