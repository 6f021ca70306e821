package createproto

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// cCreate and cHook are the bytes fastpath.c writes (server_header, then
// server_create's or server_hook's fields), spelled out as its format
// strings make them: the encoders must write exactly these.
func cCreate(exe, cfg string, explicit int, bundle, id string, start int64) []byte {
	return []byte(fmt.Sprintf("%s%c%s%c%s%c%d%c", ServerProtocol, 0, exe, 0, cfg, 0, explicit, 0) +
		fmt.Sprintf("%s%c%s%c%d%c", bundle, 0, id, 0, start, 0))
}

func cHook(exe, cfg string, explicit int, start int64, state string) []byte {
	return []byte(fmt.Sprintf("%s%c%s%c%s%c%d%c", HookProtocol, 0, exe, 0, cfg, 0, explicit, 0) +
		fmt.Sprintf("%d%c", start, 0) + state + "\x00")
}

const id = "2049:1234567:51200000:1764300000.000000123"

// TestRoundTrip: each message decodes to what was encoded, its bytes are
// fastpath.c's, and it is Whole only once its last NUL arrived.
func TestRoundTrip(t *testing.T) {
	creates := []struct {
		c    Create
		want []byte
	}{
		{Create{Exe: id, ConfigPath: "/etc/gantry/config.toml", Bundle: "/run/containerd/b", Container: "ctr-1", StartNS: 123456789}, cCreate(id, "/etc/gantry/config.toml", 0, "/run/containerd/b", "ctr-1", 123456789)},
		{Create{Exe: id, ConfigPath: "/tmp/my config.toml", Explicit: true, Bundle: "rel/bundle", Container: "x", StartNS: 0}, cCreate(id, "/tmp/my config.toml", 1, "rel/bundle", "x", 0)},
		{Create{Exe: id, Container: "no-bundle-named", StartNS: -1}, cCreate(id, "", 0, "", "no-bundle-named", -1)},
	}
	for _, tc := range creates {
		b := tc.c.Encode()
		if !bytes.Equal(b, tc.want) {
			t.Errorf("Encode(%+v) = %q, fastpath.c writes %q", tc.c, b, tc.want)
		}
		got, err := DecodeCreate(b)
		if err != nil || got != tc.c {
			t.Errorf("DecodeCreate(Encode(%+v)) = %+v, %v", tc.c, got, err)
		}
		if got.IsPing() {
			t.Errorf("%+v reads as a ping", got)
		}
		if _, err := DecodeHook(b); err == nil {
			t.Errorf("a create's request %q decodes as a hook's", b)
		}
		if _, err := DecodePing(b); err == nil {
			t.Errorf("a create's request %q decodes as a ping", b)
		}
		wholeOnlyAtEnd(t, b)
	}

	hooks := []struct {
		h    Hook
		want []byte
	}{
		{Hook{Exe: id, ConfigPath: "/etc/gantry/config.toml", StartNS: 42, State: []byte(`{"ociVersion":"1.0.2","id":"c","pid":7,"bundle":"/b"}`)}, cHook(id, "/etc/gantry/config.toml", 0, 42, `{"ociVersion":"1.0.2","id":"c","pid":7,"bundle":"/b"}`)},
		{Hook{Exe: id, Explicit: true, ConfigPath: "/c", StartNS: 1, State: []byte(strings.Repeat("s", MaxHookState))}, cHook(id, "/c", 1, 1, strings.Repeat("s", MaxHookState))},
	}
	for _, tc := range hooks {
		b := tc.h.Encode()
		if !bytes.Equal(b, tc.want) {
			t.Errorf("Encode(%+v) = %q, fastpath.c writes %q", tc.h, b, tc.want)
		}
		if !IsHook(b) {
			t.Errorf("IsHook(%q) = false", b)
		}
		got, err := DecodeHook(b)
		if err != nil || !reflect.DeepEqual(got, tc.h) {
			t.Errorf("DecodeHook(Encode(%+v)) = %+v, %v", tc.h, got, err)
		}
		if _, err := DecodeCreate(b); err == nil {
			t.Errorf("a hook's request decodes as a create's")
		}
		wholeOnlyAtEnd(t, b)
	}

	// The ping: a create's request with an identity only, which
	// PingServer has always sent as these bytes.
	p := Ping{Exe: id}
	b := p.Encode()
	if want := ServerProtocol + "\x00" + id + "\x00\x000\x00\x00\x000\x00"; string(b) != want {
		t.Errorf("Ping.Encode = %q, want %q", b, want)
	}
	if got, err := DecodePing(b); err != nil || got != p {
		t.Errorf("DecodePing(Encode(%+v)) = %+v, %v", p, got, err)
	}
	if c, err := DecodeCreate(b); err != nil || !c.IsPing() {
		t.Errorf("a ping decodes as create %+v (%v), not a ping", c, err)
	}
	wholeOnlyAtEnd(t, b)
	for _, a := range []PingAnswer{{AnswerDone, id}, {AnswerSelf, "1:2:3:4.000000005"}} {
		got, err := DecodePingAnswer(a.Encode())
		if err != nil || got != a {
			t.Errorf("DecodePingAnswer(Encode(%+v)) = %+v, %v", a, got, err)
		}
	}
}

// wholeOnlyAtEnd checks that every proper prefix of a request b is not
// Whole and does not decode, and b is Whole.
func wholeOnlyAtEnd(t *testing.T, b []byte) {
	t.Helper()
	if !Whole(b) {
		t.Errorf("Whole(%q) = false", b)
	}
	for i := len(ServerProtocol) + 1; i < len(b); i++ {
		if len(b) > 4096 && b[i-1] != 0 && b[i] != 0 && i%997 != 0 {
			continue // a long state: its field ends and some cuts inside
		}
		p := b[:i]
		if Whole(p) {
			t.Errorf("Whole of the first %d bytes of %q = true", i, b)
			return
		}
		_, e1 := DecodeCreate(p)
		_, e2 := DecodeHook(p)
		if e1 == nil || e2 == nil {
			t.Errorf("the first %d bytes of %q decode (create: %v, hook: %v)", i, b, e1, e2)
			return
		}
	}
}

// TestDecodeHostile: requests that are not whole, not of the protocol, or
// whose fields are out of their form are refused, never half read.
func TestDecodeHostile(t *testing.T) {
	ok := string(Create{Exe: id, ConfigPath: "/c", Bundle: "/b", Container: "c", StartNS: 1}.Encode())
	for _, b := range []string{
		"",
		"\x00",
		ServerProtocol,
		ServerProtocol + "\x00",
		strings.TrimSuffix(ok, "\x00"), // the last NUL missing
		ok + "extra\x00",               // a field more
		ok + "\x00",                    // an empty field more
		strings.Replace(ok, ServerProtocol, "gantry-create/2", 1), // another version
		strings.Replace(ok, ServerProtocol, HookProtocol, 1),      // another message's name
		"x" + ok,
		string(cCreate("", "/c", 0, "/b", "c", 1)),                   // no identity
		string(cCreate(id, "relative/config.toml", 0, "/b", "c", 1)), // a config the server cannot resolve
		string(cCreate(id, "/c", 2, "/b", "c", 1)),                   // explicit neither 0 nor 1
		strings.Replace(ok, "\x000\x00/b", "\x00true\x00/b", 1),
		string(cCreate(id, "/c", 0, "/b", "", 1)) + "",               // a bundle without a container
		strings.Replace(ok, "\x001\x00", "\x00one\x00", 1),           // start not a number
		strings.TrimSuffix(ok, "1\x00") + "99999999999999999999\x00", // start out of range
		strings.Replace(ok, "/c", "/c\n/d", 1)[:len(ok)-3],
	} {
		if c, err := DecodeCreate([]byte(b)); err == nil {
			t.Errorf("DecodeCreate(%q) = %+v, want an error", b, c)
		}
		if _, err := DecodePing([]byte(b)); err == nil {
			t.Errorf("DecodePing(%q) accepted", b)
		}
	}
	okHook := string(cHook(id, "/c", 0, 1, "{}"))
	for _, b := range []string{
		"",
		HookProtocol + "\x00",
		strings.TrimSuffix(okHook, "\x00"),
		okHook + "x\x00",
		string(cHook(id, "/c", 0, 1, "")),       // no state
		string(cHook(id, "/c", 0, 1, "{\x00}")), // a NUL inside the state
		string(cHook("", "/c", 0, 1, "{}")),
		string(cHook(id, "c", 0, 1, "{}")),
		string(cHook(id, "/c", 3, 1, "{}")),
		strings.Replace(okHook, "\x001\x00{}", "\x00x\x00{}", 1),
		strings.Replace(okHook, HookProtocol, ServerProtocol, 1),
	} {
		if h, err := DecodeHook([]byte(b)); err == nil {
			t.Errorf("DecodeHook(%q) = %+v, want an error", b, h)
		}
	}
	if _, err := DecodePing([]byte(ok)); err == nil {
		t.Errorf("a create with a bundle decodes as a ping")
	}
	for _, b := range []string{"", "N", "Y", "Yx", "Y" + id + "\x00", "Q" + id, "Y1:2:3:4.5", "N" + id + "\n"} {
		if a, err := DecodePingAnswer([]byte(b)); err == nil {
			t.Errorf("DecodePingAnswer(%q) = %+v, want an error", b, a)
		}
	}
}

// FuzzDecode: no input makes a decoder panic, and what decodes encodes to
// a request that decodes to the same message.
func FuzzDecode(f *testing.F) {
	f.Add(Create{Exe: id, ConfigPath: "/c", Bundle: "/b", Container: "c", StartNS: 1}.Encode())
	f.Add(Hook{Exe: id, StartNS: 1, State: []byte("{}")}.Encode())
	f.Add(Ping{Exe: id}.Encode())
	f.Add(PingAnswer{AnswerDone, id}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		Whole(b)
		if c, err := DecodeCreate(b); err == nil {
			if again, err := DecodeCreate(c.Encode()); err != nil || again != c {
				t.Errorf("create %+v: re-decoded %+v, %v", c, again, err)
			}
		}
		if h, err := DecodeHook(b); err == nil {
			if again, err := DecodeHook(h.Encode()); err != nil || !reflect.DeepEqual(again, h) {
				t.Errorf("hook %+v: re-decoded %+v, %v", h, again, err)
			}
		}
		if a, err := DecodePingAnswer(b); err == nil {
			if again, err := DecodePingAnswer(a.Encode()); err != nil || again != a {
				t.Errorf("ping answer %+v: re-decoded %+v, %v", a, again, err)
			}
		}
	})
}
