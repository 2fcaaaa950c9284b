// CI helper: starts one embedded OpenSearch node on 127.0.0.1:<httpPort> until SIGTERM.
// Run in single-file source mode (no build step):
//   java -cp "$(classpath from pom.xml)" OpenSearchLauncher.java <httpPort> <baseDir>
// The codelibs runner's own main() cannot pin an exact port (it probes upward from
// -baseHttpPort+1 and gives up above 9299) and cannot take arbitrary settings, hence this.
import java.util.concurrent.CountDownLatch;

import org.codelibs.opensearch.runner.OpenSearchRunner;

public class OpenSearchLauncher {
    public static void main(final String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: OpenSearchLauncher <httpPort> <baseDir>");
            System.exit(2);
        }
        final String httpPort = args[0];
        final String baseDir = args[1];
        final OpenSearchRunner runner = new OpenSearchRunner();
        final CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                runner.close();
            } catch (final Exception e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }));
        runner.setMaxHttpPort(-1); // never probe for another port: bind exactly httpPort or fail
        runner.onBuild((index, settings) -> settings
                .put("http.port", httpPort)
                .put("network.host", "127.0.0.1")
                .put("discovery.type", "single-node")
                .putList("node.roles", "cluster_manager", "data", "ingest")
                // CI disks can be fuller than the 85%/90% watermarks; don't refuse shards
                .put("cluster.routing.allocation.disk.threshold_enabled", false)
                .put("action.destructive_requires_name", false)
                // fs snapshot repositories (tests of the backup procedure) live here;
                // a relative repository location resolves against it
                .putList("path.repo", baseDir + "/snapshots"));
        try {
            runner.build("-basePath", baseDir, "-numOfNode", "1", "-clusterName", "attest-ci");
        } catch (final Throwable t) {
            System.err.println("OpenSearchLauncher: node failed to start");
            t.printStackTrace();
            Runtime.getRuntime().halt(1);
        }
        System.out.println("OpenSearchLauncher: node started on 127.0.0.1:" + httpPort);
        closed.await(); // park the main thread; the shutdown hook closes the node
    }
}
