package badger

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mappedFiles lists this process's mappings of files in dir, from /proc/self/smaps.
func mappedFiles(dir string) ([]mapping, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	var cur *mapping
	prefix := dir + string(os.PathSeparator)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if rss, ok := bytes.CutPrefix(line, []byte("Rss:")); ok {
			if cur != nil {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(rss)), " kB"), 10, 64)
				cur.resident = kb << 10
			}
			continue
		}
		if m, ok := mappingHeader(string(line), prefix); ok {
			out = append(out, m)
			cur = &out[len(out)-1]
		} else if isMappingHeader(line) {
			cur = nil
		}
	}
	return out, sc.Err()
}

// isMappingHeader reports whether an smaps line starts a mapping ("start-end perms ...") rather
// than being one of its fields ("Name:   value").
func isMappingHeader(line []byte) bool {
	i := bytes.IndexByte(line, ' ')
	return i > 0 && bytes.IndexByte(line[:i], '-') > 0 && !bytes.HasSuffix(line[:i], []byte(":"))
}

// mappingHeader parses a mapping's header line when it maps a file under prefix.
func mappingHeader(line, prefix string) (mapping, bool) {
	fields := strings.Fields(line)
	if len(fields) < 6 || !strings.HasPrefix(fields[5], prefix) {
		return mapping{}, false
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	if !ok {
		return mapping{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || end <= start {
		return mapping{}, false
	}
	return mapping{start: uintptr(start), end: uintptr(end), path: strings.Join(fields[5:], " ")}, true
}

// pageOut asks the kernel to reclaim m's pages (MADV_PAGEOUT, Linux 5.4): dirty ones are
// written back first, so nothing is lost, and a later read faults them in again. Unlike
// MADV_DONTNEED it cannot lose data even if the range was unmapped and reused meanwhile (an
// anonymous page would be swapped out, not dropped).
func pageOut(m mapping) error {
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_PAGEOUT)
	if errno != 0 {
		return errno
	}
	return nil
}

// residentBytes is this process's resident set, from /proc/self/statm (its second field, in
// pages): one short line, cheap to read ten times a second.
func residentBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0, errors.New("statm: too short")
	}
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize()), err
}
