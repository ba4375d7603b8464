package testkit

import "encoding/base64"

// Two valid Standard Webhooks secrets: the current one and the one being rotated out.
var (
	SecretNew = "whsec_" + base64.StdEncoding.EncodeToString([]byte("new-signing-key-of-32-bytes-long"))
	SecretOld = "whsec_" + base64.StdEncoding.EncodeToString([]byte("old-signing-key-of-32-bytes-long"))
)
