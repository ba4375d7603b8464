package badger

import (
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Badger reads and writes its value logs through memory mappings, and a page of a mapping once
// touched counts in the process's resident set until the kernel needs it back: a 107 MB batch
// input left over 300 MiB of value-log pages resident after its run, though the gateway's heap
// held 60 MiB (docs/backends.md, "Badger's memory"). The pages are the page cache's, clean once
// written back, so nothing requires them mapped; paging them out keeps the resident set bounded
// by Badger's settings rather than by what the database ever held. A value log other than the
// newest is never written again, so its pages are paged out once they pass residentSlack; the
// newest is bounded by value_log_file_size, the memtables' logs by memtables x memtable_size.

// residentEvery is how often the mapped value logs are looked at.
const residentEvery = time.Second

// residentSlack is what an older value log may keep resident: the values read often (records
// replayed, lines about to run) stay, a file read or written through does not.
const residentSlack = 4 << 20

// keepResident pages out the database's older value logs every `every` (0: residentEvery;
// below 0: never), until the database closes.
func (sh *shared) keepResident(every time.Duration) {
	defer close(sh.residentDone)
	if every < 0 {
		<-sh.stopGC
		return
	}
	if every == 0 {
		every = residentEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-sh.stopGC:
			return
		case <-t.C:
			sh.pageOutOlderLogs()
		}
	}
}

// pageOutOlderLogs pages out each mapped value log but the newest whose resident pages pass
// residentSlack, and returns the bytes it asked the kernel to page out.
func (sh *shared) pageOutOlderLogs() int64 {
	maps, err := mappedFiles(sh.dir)
	if err != nil || len(maps) == 0 {
		return 0
	}
	var vlogs []string
	for _, m := range maps {
		if strings.HasSuffix(m.path, ".vlog") && !slices.Contains(vlogs, m.path) {
			vlogs = append(vlogs, m.path)
		}
	}
	slices.Sort(vlogs) // Badger numbers its value logs in order: 000001.vlog, 000002.vlog, ...
	newest := ""
	if len(vlogs) > 0 {
		newest = vlogs[len(vlogs)-1]
	}
	var out int64
	for _, m := range maps {
		if filepath.Ext(m.path) != ".vlog" || m.path == newest || m.resident <= residentSlack {
			continue
		}
		if pageOut(m) == nil {
			out += m.resident
		}
	}
	return out
}

// mapping is one memory mapping of a database file, and how much of it is resident.
type mapping struct {
	start, end uintptr
	path       string
	resident   int64
}
