package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/cube-runtime/cube/guest-agent/container"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors carry a status code for the ttrpc client; these constructors keep
// the message text in one place.
func errNotFound(format string, a ...any) error {
	return status.Errorf(codes.NotFound, format, a...)
}

func errInvalid(format string, a ...any) error {
	return status.Errorf(codes.InvalidArgument, format, a...)
}

func errState(format string, a ...any) error {
	return status.Errorf(codes.FailedPrecondition, format, a...)
}

// toStatus maps an internal error to a status error, prefixing what.
func toStatus(err error, format string, a ...any) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	what := fmt.Sprintf(format, a...)
	code := codes.Internal
	var errno unix.Errno
	switch {
	case errors.Is(err, container.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, container.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.As(err, &errno):
		switch errno {
		case unix.ENOENT, unix.ENXIO, unix.ENODEV:
			code = codes.NotFound
		case unix.EACCES, unix.EPERM:
			code = codes.PermissionDenied
		case unix.EISDIR, unix.ENOTDIR, unix.ELOOP, unix.EXDEV, unix.EINVAL, unix.ENAMETOOLONG:
			code = codes.InvalidArgument
		case unix.EEXIST:
			code = codes.AlreadyExists
		case unix.EBUSY:
			code = codes.FailedPrecondition
		}
	}
	return status.Errorf(code, "%s: %v", what, err)
}

func errUnavailable(msg string) error {
	return status.Error(codes.Unavailable, msg)
}
