#!/bin/sh
# Builds one release of h3-ingress with a tag no other build has: VERSION-COMMIT (Cargo.toml's
# version and the first 12 digits of HEAD), e.g. 0.1.0-3f2a9c1b7d4e. The binary reports it
# (`h3-ingress --version`, /status, build_info), the image gets it as its tag, and the chart is
# packaged with it as appVersion, so the chart's default image is exactly this build and nodes
# never keep running a cached image under a reused tag (the chart pulls such tags IfNotPresent,
# others Always).
#
#   scripts/release.sh [REPOSITORY]     default REPOSITORY: ghcr.io/h3-ingress/h3-ingress
#
# Writes dist/h3-ingress and dist/arm64/h3-ingress (the static binaries, amd64 and arm64),
# dist/image/ (scripts/image.sh: the image index REPOSITORY:VERSION-COMMIT of both, as an OCI
# layout and archive; no Docker engine needed) and dist/h3-ingress-CHART_VERSION.tgz (the chart,
# appVersion and image.repository set), and prints how to push the index (or build the same
# with docker buildx). Refuses a dirty tree: the commit would not name what was built.
set -eu
cd "$(dirname "$0")/.."
repo=${1:-ghcr.io/h3-ingress/h3-ingress}
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "release.sh: the work tree has uncommitted changes; commit them first" >&2
    exit 1
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
commit=$(git rev-parse --short=12 HEAD)
tag="$version-$commit"
chart_version=$(sed -n 's/^version: *//p' charts/h3-ingress/Chart.yaml)
mkdir -p dist

H3I_GIT_COMMIT=$commit scripts/build-static.sh --arch amd64 dist/h3-ingress
H3I_GIT_COMMIT=$commit scripts/build-static.sh --arch arm64 dist/arm64/h3-ingress
# scripts/image.sh checks that both binaries are this build (the arm64 one under qemu-user).
H3I_IMAGE_REPOSITORY=$repo H3I_IMAGE_OUT=dist/image scripts/image.sh dist/h3-ingress dist/arm64/h3-ingress
case $(head -n 1 dist/image/oci/index.json) in
    *"$repo:$tag"*) ;;
    *) echo "release.sh: dist/image is not $repo:$tag" >&2; exit 1 ;;
esac

# The chart as `helm package --app-version` would write it, with the image repository set.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r charts/h3-ingress "$work/h3-ingress"
sed -i "s/^appVersion: .*/appVersion: \"$tag\"/" "$work/h3-ingress/Chart.yaml"
sed -i "s|^  repository: .*|  repository: $repo|" "$work/h3-ingress/values.yaml"
tar -czf "dist/h3-ingress-$chart_version.tgz" -C "$work" h3-ingress
echo "packaged dist/h3-ingress-$chart_version.tgz (appVersion $tag, image $repo:$tag)"

echo "push the image index with: skopeo copy --all oci:dist/image/oci docker://$repo:$tag"
echo "or build and push the same index with: docker buildx build --platform linux/amd64,linux/arm64" \
    "-t $repo:$tag --build-arg VERSION=$version --build-arg REVISION=$commit --push ."
