module managedjobs.dev/hack/flux/git-http

go 1.26.0
