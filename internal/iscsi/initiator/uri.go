package initiator

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// URI is a parsed iscsi:// address in libiscsi's (and QEMU's) form:
//
//	iscsi://[user[%secret]@]host[:port]/IQN/LUN[?key=value&...]
//
// The user%secret form is not valid RFC 3986 (a '%' must start an
// escape), which is why it is parsed here rather than by net/url. Query
// keys: target_user and target_password (mutual CHAP), header_digest and
// data_digest ("crc32c", "none", or libiscsi's "crc32c-none" /
// "none-crc32c" preference lists), initiator_name.
type URI struct {
	Addr string // host:port (port 3260 when absent)
	Config
	LUN uint16
}

// ParseURI parses an iscsi:// URI; the IQN may be empty (discovery).
func ParseURI(raw string) (*URI, error) {
	rest, ok := strings.CutPrefix(raw, "iscsi://")
	if !ok {
		return nil, fmt.Errorf("iscsi: %q does not start with iscsi://", raw)
	}
	var query string
	rest, query, _ = strings.Cut(rest, "?")
	hostPart, path, _ := strings.Cut(rest, "/")
	u := &URI{}
	if at := strings.LastIndexByte(hostPart, '@'); at >= 0 {
		ui := hostPart[:at]
		hostPart = hostPart[at+1:]
		user, secret, _ := strings.Cut(ui, "%")
		if user == "" {
			return nil, fmt.Errorf("iscsi: %q: empty CHAP user", raw)
		}
		u.User, u.Secret = user, secret
	}
	if hostPart == "" {
		return nil, fmt.Errorf("iscsi: %q has no host", raw)
	}
	if _, _, err := net.SplitHostPort(hostPart); err != nil {
		h := strings.TrimSuffix(strings.TrimPrefix(hostPart, "["), "]")
		hostPart = net.JoinHostPort(h, "3260")
	}
	u.Addr = hostPart
	iqn, lun, hasLUN := strings.Cut(path, "/")
	u.TargetName = iqn
	if hasLUN && lun != "" {
		n, err := strconv.ParseUint(lun, 10, 14)
		if err != nil {
			return nil, fmt.Errorf("iscsi: %q: LUN %q is not 0..16383", raw, lun)
		}
		u.LUN = uint16(n)
	} else if iqn != "" {
		return nil, fmt.Errorf("iscsi: %q: no LUN (iscsi://host/IQN/LUN)", raw)
	}
	if query != "" {
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, fmt.Errorf("iscsi: %q: %v", raw, err)
		}
		for k, vs := range q {
			v := vs[len(vs)-1]
			switch k {
			case "target_user":
				u.TargetUser = v
			case "target_password":
				u.TargetSecret = v
			case "initiator_name":
				u.InitiatorName = v
			case "header_digest", "data_digest":
				d, err := digestList(v)
				if err != nil {
					return nil, fmt.Errorf("iscsi: %q: %s: %v", raw, k, err)
				}
				if k == "header_digest" {
					u.HeaderDigest = d
				} else {
					u.DataDigest = d
				}
			default:
				return nil, fmt.Errorf("iscsi: %q: unknown parameter %q", raw, k)
			}
		}
	}
	return u, nil
}

func digestList(v string) (string, error) {
	switch strings.ToLower(v) {
	case "none":
		return "None", nil
	case "crc32c":
		return "CRC32C", nil
	case "crc32c-none":
		return "CRC32C,None", nil
	case "none-crc32c":
		return "None,CRC32C", nil
	}
	return "", fmt.Errorf("%q is not none, crc32c, crc32c-none or none-crc32c", v)
}
