# Builds every onceflow binary into one small image; compose/ runs each
# component from it with a different command.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/...

# No shell, no package manager: the binaries, CA certificates and the
# user nonroot (65532), which the processes run as.
FROM gcr.io/distroless/static-debian12:nonroot
# docker build --build-arg VERSION=$(git describe --tags) (make images
# labels the local image the same way, compose/local/onceflow.Containerfile).
ARG VERSION=dev
LABEL org.opencontainers.image.title="onceflow" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/onceflow/onceflow"
COPY --from=build /out/ /usr/local/bin/
USER nonroot
# The admin address binds loopback unless ADMIN_ADDR names an interface:
# set ADMIN_ADDR=:9090 for Prometheus and probes outside the container
# (compose/docker-compose.yml does).
EXPOSE 8080 9090
ENTRYPOINT []
