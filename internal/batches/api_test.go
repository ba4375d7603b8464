package batches

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
)

// kicks counts the worker's wake-ups.
type kicks struct{ n atomic.Int64 }

func (k *kicks) Kick() { k.n.Add(1) }

// api is the Files and Batches API on the fixture's storage and clock: files of up to 1 KiB,
// two per scope, kept an hour.
func (f *fixture) api(t *testing.T, k Kicker) *API {
	var n atomic.Int64
	return &API{Store: f.st, Worker: k, Clock: f.clock, Retention: time.Hour, Scope: "{http.request.header.authorization}",
		Config: Config{Prefix: "/v1", MaxFileSize: 1 << 10, MaxRequests: 10, MaxScopeBytes: 1 << 20, MaxScopeFiles: 2},
		NewID: func(prefix string, now time.Time) string {
			return fmt.Sprintf("%s%013d%04d", prefix, now.UnixMilli(), n.Add(1))
		},
		Origin: func(http.ResponseWriter, *http.Request) (Origin, bool) { return Origin{Server: "srv0"}, true },
		Log:    zaptest.NewLogger(t)}
}

// upload is a multipart upload of content, its file part before its purpose as the SDKs send.
func upload(t *testing.T, content, purpose string) *http.Request {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", "in.jsonl")
	if err == nil {
		_, err = fw.Write([]byte(content))
	}
	if err == nil {
		err = mw.WriteField("purpose", purpose)
	}
	if err != nil || mw.Close() != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/files", &body)
	r.Header.Set("Content-Type", mw.FormDataContentType())
	return r
}

// answer decodes rec's body into v, failing unless its status is want.
func answer(t *testing.T, rec *httptest.ResponseRecorder, want int, v any) {
	t.Helper()
	if rec.Code != want || json.Unmarshal(rec.Body.Bytes(), v) != nil {
		t.Fatalf("answered %d %s, want %d", rec.Code, rec.Body, want)
	}
}

// refused checks rec is OpenAI's error with code and a message holding msg.
func refused(t *testing.T, rec *httptest.ResponseRecorder, code apierr.Code, msg string) {
	t.Helper()
	var b apierr.Body
	answer(t, rec, apierr.Status(code), &b)
	if b.Error.Code != code || b.Error.Type == "" || !strings.Contains(b.Error.Message, msg) {
		t.Fatalf("error %+v, want %s with %q", b.Error, code, msg)
	}
}

var alice = Caller{Scope: "alice"}

// uploaded is alice's upload of content as a batch file.
func uploaded(t *testing.T, api *API, content string) fileView {
	t.Helper()
	rec := httptest.NewRecorder()
	api.Call(rec, upload(t, content, "batch"), alice).UploadFile()
	var file fileView
	answer(t, rec, http.StatusOK, &file)
	return file
}

// TestAnUploadExpiresAfterTheRetentionOnTheAPIsClock: an upload is stored with its lines and an
// expiry one retention after the clock's now; once the clock passes it, the file is gone.
func TestAnUploadExpiresAfterTheRetentionOnTheAPIsClock(t *testing.T) {
	f := newFixture(t)
	api := f.api(t, &kicks{})
	file := uploaded(t, api, input(3))
	if want := f.clock.Now().Add(time.Hour).Unix(); file.ExpiresAt == nil || *file.ExpiresAt != want || file.Purpose != "batch" || file.Filename != "in.jsonl" {
		t.Fatalf("file %+v, want batch file in.jsonl expiring at %d", file, want)
	}
	rec := httptest.NewRecorder()
	api.Call(rec, httptest.NewRequest(http.MethodGet, "/v1/files/"+file.ID+"/content", nil), alice).FileContent(file.ID)
	if rec.Code != http.StatusOK || rec.Body.String() != input(3) {
		t.Fatalf("content %d %q, want the upload", rec.Code, rec.Body)
	}
	f.clock.Advance(time.Hour)
	rec = httptest.NewRecorder()
	api.Call(rec, httptest.NewRequest(http.MethodGet, "/v1/files/"+file.ID, nil), alice).GetFile(file.ID)
	refused(t, rec, apierr.CodeFileNotFound, "No such File object: "+file.ID)
}

// TestUploadsOverTheScopesQuotaOrOfAnotherPurposeLeaveNothingStored: the third file of a scope
// allowed two is refused with its quota named, and an upload whose purpose is not batch is
// dropped; the scope lists only the two it keeps.
func TestUploadsOverTheScopesQuotaOrOfAnotherPurposeLeaveNothingStored(t *testing.T) {
	f := newFixture(t)
	api := f.api(t, &kicks{})
	rec := httptest.NewRecorder()
	api.Call(rec, upload(t, input(1), "fine-tune"), alice).UploadFile()
	refused(t, rec, apierr.CodeInvalidRequest, `Only purpose "batch" is served here; got "fine-tune"`)
	for range 2 {
		uploaded(t, api, input(1))
	}
	rec = httptest.NewRecorder()
	api.Call(rec, upload(t, input(1), "batch"), alice).UploadFile()
	refused(t, rec, apierr.CodeFileQuota, "over its quota (2 files")
	rec = httptest.NewRecorder()
	api.Call(rec, httptest.NewRequest(http.MethodGet, "/v1/files", nil), alice).ListFiles()
	var list listView[fileView]
	answer(t, rec, http.StatusOK, &list)
	if len(list.Data) != 2 || list.HasMore {
		t.Fatalf("the scope lists %d files (more: %v), want the 2 kept", len(list.Data), list.HasMore)
	}
}

// TestABatchIsCreatedOnTheClockSeenOnlyByItsScopeAndCancelled: a create stamps the deadline one
// completion window after the clock's now, takes the origin's server and the creator's
// credentials for its lines, wakes the worker; another scope sees no such batch; a cancel
// before any line was created settles it cancelled at once, and wakes the worker again.
func TestABatchIsCreatedOnTheClockSeenOnlyByItsScopeAndCancelled(t *testing.T) {
	f := newFixture(t)
	k := &kicks{}
	api := f.api(t, k)
	file := uploaded(t, api, input(2))
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"2h"}`, file.ID, chatPath)
	r := httptest.NewRequest(http.MethodPost, "/v1/batches", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer a")
	r.Header.Set("Cookie", "session=1")
	rec := httptest.NewRecorder()
	api.Call(rec, r, alice).CreateBatch()
	var v View
	answer(t, rec, http.StatusOK, &v)
	if v.Status != store.BatchValidating || v.ExpiresAt == nil || *v.ExpiresAt != f.clock.Now().Add(2*time.Hour).Unix() || k.n.Load() != 1 {
		t.Fatalf("batch %+v after %d kicks, want validating, expiring in 2h, one kick", v, k.n.Load())
	}
	stored, err := f.st.GetBatch(v.ID)
	if err != nil || stored.Server != "srv0" || stored.Template.Header.Get("Authorization") != "Bearer a" || stored.Template.Header.Get("Cookie") != "" {
		t.Fatalf("stored batch %+v %v, want server srv0 and the creator's credentials without its cookie", stored, err)
	}

	rec = httptest.NewRecorder()
	api.Call(rec, httptest.NewRequest(http.MethodGet, "/v1/batches/"+v.ID, nil), Caller{Scope: "bob"}).GetBatch(v.ID)
	refused(t, rec, apierr.CodeBatchNotFound, "No such Batch object: "+v.ID)

	rec = httptest.NewRecorder()
	api.Call(rec, httptest.NewRequest(http.MethodPost, "/v1/batches/"+v.ID+"/cancel", nil), alice).CancelBatch(v.ID)
	answer(t, rec, http.StatusOK, &v)
	if v.Status != store.BatchCancelled || v.CancellingAt == nil || *v.CancellingAt != f.clock.Now().Unix() || k.n.Load() != 2 {
		t.Fatalf("cancelled batch %+v after %d kicks, want cancelled, cancelling now, a second kick", v, k.n.Load())
	}
}

// TestABatchMustNameAnEndpointItsFileAndAWindowInRange: the create's checks, each refused with
// OpenAI's 400 naming what is wrong; none stores a batch or wakes the worker.
func TestABatchMustNameAnEndpointItsFileAndAWindowInRange(t *testing.T) {
	f := newFixture(t)
	k := &kicks{}
	api := f.api(t, k)
	big := uploaded(t, api, input(11))
	for _, c := range []struct{ body, msg string }{
		{`{"endpoint":"/v1/chat/completions","completion_window":"24h"}`, "Missing required parameter: 'input_file_id'."},
		{`{"input_file_id":"file-x","endpoint":"/v1/files","completion_window":"24h"}`, "endpoint must be the path each line is sent to"},
		{`{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"169h"}`, "completion_window must be a duration"},
		{`{"input_file_id":"` + big.ID + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "more lines than max_requests allows"},
	} {
		rec := httptest.NewRecorder()
		api.Call(rec, httptest.NewRequest(http.MethodPost, "/v1/batches", strings.NewReader(c.body)), alice).CreateBatch()
		refused(t, rec, apierr.CodeInvalidRequest, c.msg)
	}
	if n := k.n.Load(); n != 0 {
		t.Fatalf("refused creates woke the worker %d times", n)
	}
	if ids, err := f.st.UnsettledBatches(); err != nil || len(ids) != 0 {
		t.Fatalf("refused creates stored batches %v (%v)", ids, err)
	}
}
