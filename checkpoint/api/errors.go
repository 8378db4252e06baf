package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/containerd/errdefs"
)

// Error is the body of every error response: code is the HTTP status.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusOf maps an errdefs class to an HTTP status.
func statusOf(err error) int {
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		return http.StatusRequestEntityTooLarge
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsUnauthorized(err):
		return http.StatusUnauthorized
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsConflict(err), errdefs.IsAlreadyExists(err), errdefs.IsFailedPrecondition(err):
		return http.StatusConflict
	case errdefs.IsNotImplemented(err):
		return http.StatusNotImplemented
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	case errdefs.IsDeadlineExceeded(err), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// conflictError marks err (the shim's "busy") as a conflict too.
type conflictError struct{ err error }

func (c conflictError) Error() string   { return c.err.Error() }
func (c conflictError) Unwrap() []error { return []error{c.err, errdefs.ErrConflict} }

// writeError writes err as {code, message} with its status.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	msg := err.Error()
	if mb, ok := err.(*http.MaxBytesError); ok {
		msg = fmt.Sprintf("request body larger than %d bytes (max_body_bytes)", mb.Limit)
	}
	entry := logOf(r).WithError(err).WithField("status", code)
	if code >= 500 {
		entry.Error("request failed")
	} else {
		entry.Debug("request refused")
	}
	writeJSON(w, code, Error{Code: code, Message: msg})
}

// writeJSON writes v as the response.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

// invalid is an InvalidArgument error.
func invalid(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// decode reads the JSON body of r into v: unknown fields, wrong types,
// malformed JSON and trailing data are InvalidArgument naming the field or
// the offset; an oversized body is *http.MaxBytesError. An empty body leaves
// v as it is when optional.
func decode(r *http.Request, v any, optional bool) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		return invalid("read the request body: %v", err)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		if optional {
			return nil
		}
		return invalid("the request body is empty: want a JSON object")
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return invalid("malformed JSON: data after the object at byte %d", dec.InputOffset())
	}
	return exactFields(body, reflect.TypeOf(v), "")
}

// exactFields refuses a field name that encoding/json matched only
// case-insensitively ("templateId" for "templateID"), in body's object and
// the objects of its struct-typed fields: the API's names are exact, as
// E2B's. body has decoded into t already.
func exactFields(body []byte, t reflect.Type, at string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil // null, or not an object: decoding judged it already
	}
	names := map[string]reflect.StructField{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names[name] = f
	}
	for key, raw := range obj {
		f, ok := names[key]
		if !ok {
			for name := range names {
				if strings.EqualFold(name, key) {
					return invalid("unknown field %q%s: field names are case-sensitive; did you mean %q?", key, at, name)
				}
			}
			continue
		}
		if err := exactFields(raw, f.Type, fmt.Sprintf(" in %q", key)); err != nil {
			return err
		}
	}
	return nil
}

// jsonError names the field or offset of a decoding error.
func jsonError(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return invalid("malformed JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return invalid("the request body is a JSON %s: want an object", te.Value)
		}
		return invalid("field %q: want %s, got a JSON %s", field, jsonType(te.Type.Kind().String()), te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("malformed JSON: the body ends in the middle of a value")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return invalid("unknown field %s", f)
	}
	return invalid("malformed JSON: %v", err)
}

// jsonType names a Go kind as JSON does.
func jsonType(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"), strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "string":
		return "a string"
	case kind == "bool":
		return "true or false"
	case kind == "map", kind == "struct":
		return "an object"
	case kind == "slice", kind == "array":
		return "an array"
	}
	return kind
}
